"""Security tests: what hostile parties and inputs can do to workers and decoders."""
