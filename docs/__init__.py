"""The documentation as package data (`stepsim docs` prints it from a wheel too)."""
