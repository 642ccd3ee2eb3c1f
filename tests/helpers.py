"""Small builders shared by tests."""

from simulator.scenario import scenario_from_dict


def scenario(**sections):
    """A valid scenario dict with the tiny defaults, sections updated by keyword."""
    doc = {
        "name": "test",
        "model": {
            "num_layers": 4,
            "hidden_size": 1024,
            "num_attention_heads": 16,
            "seq_length": 1024,
            "vocab_size": 32000,
        },
        "cluster": {"node": "dgx-a100", "num_nodes": 1},
        "parallel": {
            "tensor_model_parallel_size": 1,
            "pipeline_model_parallel_size": 1,
            "data_parallel_size": 1,
        },
        "training": {"micro_batch_size": 1, "global_batch_size": 8},
        "network": {"model": "fair-share"},
    }
    for name, values in sections.items():
        if isinstance(values, dict):
            doc[name] = {**doc.get(name, {}), **values}
        else:
            doc[name] = values
    return doc


def load(**sections):
    return scenario_from_dict(scenario(**sections))
