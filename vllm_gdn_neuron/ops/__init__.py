"""The public GDN op surface; validates inputs and dispatches to a backend."""
