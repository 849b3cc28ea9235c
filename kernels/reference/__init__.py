"""Float64, token-by-token references: the oracle every kernel and backend is tested against."""
