"""stepsim: a discrete-event simulator of one LLM training iteration on a GPU cluster."""

__version__ = "0.1.0"
