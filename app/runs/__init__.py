"""Training runs from the app: launch on an export, follow them, check a reward model, iterate the loop."""
