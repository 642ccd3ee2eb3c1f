"""The intermediate representation: the data that flows between the rooms, and nothing
that computes it. Ops on lanes (ops.py) with their dependency keys (keys.py); the
transfers a communication op carries and the intervals the network records (flows.py);
what a run gives (results.py: spans, traces, metrics, memory per stage, several jobs'
results); the vocabulary every room speaks (op kinds, streams, waits, collective kinds,
choices, breakdown categories) and the units at the edge (units.py). It imports nothing
else of stepsim at run time, so every room may import it: the cost model and the
emission build it, the engine runs it, the reports read it."""
