"""What a run shows a person: metrics from the spans (metrics.py), link use
(linkstats.py), the summary text (summary.py), tables for sweeps, topologies, schedule
studies and validation (tables.py), Perfetto traces (trace.py), timeline and breakdown
pictures (timeline.py, figures.py; the idle pieces by cause they draw: idle.py), and
several jobs' text and trace (jobreport.py). It reads results and the data types of the
IR; it imports neither the engine nor run/."""
