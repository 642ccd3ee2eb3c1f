"""The scenarios stepsim ships, as package data: `stepsim run NAME` and `stepsim list`
find them here."""
