"""What a user types, answered in one line: close matches for mistyped keys, sections,
choices and preset names, a key in the wrong section, token counts (`300B`, `15T`),
`--json` and `--quiet` on every command, and an `--out` that cannot be written."""

import argparse
import os
from pathlib import Path

import pytest

from stepsim.cli import build_parser
from stepsim.cli.common import MAX_TOKENS, out_errors, token_count
from stepsim.scenario import ScenarioError, scenario_from_dict
from stepsim.scenario.presets import GPUS, MODELS, NODES
from stepsim.scenario.schema import keys
from stepsim.scenario.suggest import close_matches, did_you_mean
from tests.helpers import cli_error, main_in_process, scenario

ROOT = Path(__file__).resolve().parent.parent
TINY = str(ROOT / "scenarios" / "tiny-2gpu.toml")
SCHEDULE = ["schedule", "--schedule", "1f1b", "--stages", "2", "--microbatches", "4"]
SCHEDULE += ["--forward", "1", "--backward", "2"]


# -- close matches --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("word", "choices", "found"),
    [
        ("h100", GPUS, ["h100-sxm5-80gb"]),  # begins it (difflib alone: ratio 0.44)
        ("a100", GPUS, ["a100-sxm4-40gb", "a100-sxm4-80gb"]),
        ("H100", NODES, ["dgx-h100"]),  # part of it, case apart
        ("dgx_h100", NODES, ["dgx-h100"]),  # separators apart
        ("llama3_70b", MODELS, ["llama3-70b"]),
        ("num_layer", keys()["model"], ["num_layers"]),
        ("modle", ["model", "cluster", "parallel", "training", "network"], ["model"]),
        ("zigzag", ["gpipe", "1f1b", "interleaved"], []),
        ("ring", ["switch", "fat-tree", "rail-optimized", "rail-only", "multi-plane"], []),
        (3, ["3"], []),  # not a string: nothing suggested
        ("", ["a"], []),
    ],
)
def test_close_matches(word, choices, found):
    assert close_matches(word, choices) == found


def test_did_you_mean_words_the_matches():
    assert did_you_mean("a100", GPUS) == "did you mean 'a100-sxm4-40gb' or 'a100-sxm4-80gb'?"
    assert did_you_mean("xyzzy", GPUS) == ""
    assert did_you_mean("nic_gbp", keys()["cluster"], "cluster.") == (
        "did you mean 'cluster.nic_gbps'?"
    )


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (
            ["--set", "model.num_layer=8"],
            "unknown key 'model.num_layer'; did you mean 'model.num_layers'?",
        ),
        (
            ["--set", "training.tensor_model_parallel_size=2"],
            "unknown key 'training.tensor_model_parallel_size'; it belongs in [parallel] "
            "(parallel.tensor_model_parallel_size)",
        ),
        (
            ["--set", "num_layers=8"],
            "unknown key 'num_layers' at top level; it belongs in [model] (model.num_layers)",
        ),
        (["--set", "modle.x=1"], "--set modle.x: unknown section 'modle'; did you mean 'model'?"),
        (
            ["--set", "parallel.global_batch=8"],
            "unknown key 'parallel.global_batch'; did you mean 'training.global_batch_size'?",
        ),
    ],
)
def test_unknown_keys_and_sections_get_their_close_match(args, line):
    assert cli_error(TINY, *args) == line


@pytest.mark.parametrize(
    ("setting", "suggested"),
    [
        ("cluster.gpu=h100", "h100-sxm5-80gb"),
        ("cluster.node=h100", "dgx-h100"),
        ("model.preset=llama3_70b", "llama3-70b"),
        ("training.schedule=1fb1", "1f1b"),
    ],
)
def test_a_mistyped_choice_keeps_the_list_and_suggests(setting, suggested):
    key, value = setting.split("=")
    line = cli_error(TINY, "--set", setting)
    assert line.startswith(f"{key}={value!r} must be one of: ")
    assert line.endswith(f"; did you mean {suggested!r}?")


def test_an_unknown_key_with_no_close_match_lists_its_table():
    line = cli_error(TINY, "--set", "network.xyzzy=1")
    assert line == "unknown key 'network.xyzzy'; known in [network]: " + ", ".join(
        sorted(keys()["network"])
    )


def test_a_file_key_in_the_wrong_section_and_a_mistyped_section():
    doc = scenario()
    doc["cluster"]["seq_length"] = 2048
    with pytest.raises(ScenarioError, match=r"it belongs in \[model\] \(model\.seq_length\)$"):
        scenario_from_dict(doc)
    doc = scenario()
    doc["modle"] = doc.pop("model")
    with pytest.raises(ScenarioError, match=r"^unknown key 'modle' at top level; did you mean"):
        scenario_from_dict(doc)


def test_a_mistyped_command_gets_its_close_match():
    code, out, err = main_in_process("rnu", TINY)
    assert (code, out) == (2, "")
    assert "invalid choice: 'rnu'" in err and "; did you mean 'run'? (see stepsim --help)" in err


# -- token counts -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "tokens"),
    [
        ("300B", 300e9),
        ("300b", 300e9),
        ("15T", 15e12),
        ("1.5M", 1.5e6),
        ("7k", 7e3),
        ("2.5e12", 2.5e12),
        ("300e9", 300e9),
        ("300_000_000_000", 300e9),
        ("1", 1.0),
    ],
)
def test_token_counts(text, tokens):
    assert token_count(text) == tokens


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("300X", "is not a token count"),
        ("B", "is not a token count"),
        ("-5", "is not a token count"),
        ("nan", "is not a token count"),
        ("inf", "is not a token count"),
        ("3 00B", "is not a token count"),
        ("1__000", "is not a token count"),
        ("0", "must be at least 1"),
        ("1e19", f"must be at most {MAX_TOKENS:.0e}"),
    ],
)
def test_token_counts_refused(text, why):
    with pytest.raises(argparse.ArgumentTypeError) as err:
        token_count(text)
    assert str(err.value) == f"{text!r} {why}" + (
        " (write 300B, 15T, 2.5e12 or 300_000_000_000)" if why.startswith("is not") else ""
    )


def test_plan_takes_300B_and_refuses_a_typo_in_one_line():
    code, out, err = main_in_process("plan", "time-to-train", TINY, "--tokens", "300X")
    assert (code, out) == (2, "")
    assert err == (
        "stepsim: error: argument --tokens: '300X' is not a token count (write 300B, 15T, "
        "2.5e12 or 300_000_000_000) (see stepsim plan time-to-train --help)\n"
    )
    spelled = [
        main_in_process("plan", "time-to-train", TINY, "--tokens", tokens, "--json")[:2]
        for tokens in ("300B", "3e11")
    ]
    assert spelled[0] == spelled[1] and spelled[0][0] == 0


# -- every command takes --json and --quiet ---------------------------------------------


def _commands(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()):
    """Every runnable (sub)command: (its words, its parser)."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield prefix, parser
        return
    for name, child in subs[0].choices.items():
        yield from _commands(child, (*prefix, name))


def test_every_command_takes_json_and_quiet():
    commands = dict(_commands(build_parser()))
    assert ("plan", "goodput") in commands and ("list",) in commands and len(commands) >= 13
    for words, parser in commands.items():
        flags = parser._option_string_actions
        assert "--json" in flags and "--quiet" in flags, words


@pytest.mark.parametrize(
    "argv",
    [("topology", TINY, "--quiet"), ("list", "--quiet", "--json"), (*SCHEDULE, "--quiet")],
)
def test_quiet_is_accepted_where_there_is_no_progress_line(argv):
    code, out, err = main_in_process(*argv)
    assert code == 0 and out and err == ""


# -- --out ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ("run", TINY),
        ("sweep", TINY, "--set", "cluster.nic_gbps=100,200"),
        SCHEDULE,
        ("validate", "--kernels"),
    ],
)
def test_an_out_that_cannot_be_a_folder_is_one_line_exit_2(tmp_path, argv):
    a_file = tmp_path / "taken"
    a_file.write_text("")
    for out, why in (
        (a_file, "is a file, not a folder"),
        (a_file / "sub", f"cannot create it: {str(a_file)!r} is a file"),
    ):
        code, printed, err = main_in_process(*argv, "--out", str(out))
        assert (code, printed) == (2, "")
        assert err == f"stepsim: error: --out {str(out)!r}: {why}\n"


def test_a_png_under_a_file_is_one_line_exit_2(tmp_path):
    (tmp_path / "taken").write_text("")
    png = str(tmp_path / "taken" / "topo.png")
    code, out, err = main_in_process("topology", TINY, "--png", png)
    assert (code, out) == (2, "")
    assert err.startswith(f"stepsim: error: --png {png!r}: ") and err.count("\n") == 1


def test_a_failed_write_names_the_option_the_path_and_the_reason():
    with pytest.raises(ScenarioError) as err, out_errors("--out", "runs/x"):
        raise PermissionError(13, "Permission denied", "runs/x/metrics.json")
    assert str(err.value) == "--out 'runs/x': cannot write (runs/x/metrics.json): Permission denied"


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_an_out_in_a_read_only_folder_is_one_line_exit_2(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        out = str(locked / "run")
        code, printed, err = main_in_process("run", TINY, "--out", out)
    finally:
        locked.chmod(0o700)
    assert (code, printed) == (2, "")
    assert err == (
        f"stepsim: error: --out {out!r}: cannot create it in {str(locked)!r}: permission denied\n"
    )


def test_an_out_in_a_folder_it_may_not_write_is_refused_before_the_run(tmp_path, monkeypatch):
    """The permission check (as root, which writes anywhere, seen through os.access)."""
    monkeypatch.setattr(os, "access", lambda path, mode: False)
    out = str(tmp_path / "run")
    code, printed, err = main_in_process("run", TINY, "--out", out)
    assert (code, printed) == (2, "")
    assert err == (
        f"stepsim: error: --out {out!r}: cannot create it in {str(tmp_path)!r}: permission denied\n"
    )
