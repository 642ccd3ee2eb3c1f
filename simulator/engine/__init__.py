"""The discrete-event engine and the network: the only rooms that use simpy. core.py
runs lanes of ops as callback-driven state machines (dependencies, rendezvous of a
collective's members, spans, deadlocks); network.py shares link bandwidth between the
transfers in flight (max-min fair, maxmin.py; or analytical); lookover.py is the set-up
pass over the ops; steady.py records the engine's state for the fast-forward. It imports
the IR and nothing else of stepsim."""
