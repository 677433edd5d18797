"""The TrainingJob API: the one source of truth for its schema, defaults and validation."""
