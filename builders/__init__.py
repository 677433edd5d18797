"""Pure functions from a (defaulted) TrainingJob dict to the Kubernetes objects the operator creates."""
