"""Training: loss, optimizer and schedule, the training loop."""
