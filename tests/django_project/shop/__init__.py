"""An app with models and tasks."""
