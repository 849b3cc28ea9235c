"""A CPU interpreter of the public NKI API with trn2 limits and a cost model."""
