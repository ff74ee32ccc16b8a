"""The sidecar's route modules, one per resource; ``create_app`` lists them."""
