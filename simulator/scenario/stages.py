"""How the layers split over pipeline stages and chunks, as Megatron-Core splits them,
checked: evenly, or as its four uneven-split keys say (`stage_layers`). The layout
rules (`rules.check_model_split`) run it; the specs, the memory model, the lowering and
the summary read its counts."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from stepsim.schedules import DUAL, LOOPED, holder_of

from ..ir.vocabulary import SHARD_FULL, SHARD_GRADIENTS
from .errors import ScenarioError

if TYPE_CHECKING:
    from .spec import ModelSpec, ParallelConfig, TrainingConfig

FIRST_KEY = "parallel.decoder_first_pipeline_num_layers"
LAST_KEY = "parallel.decoder_last_pipeline_num_layers"


LAYOUT_KEY = "parallel.pipeline_model_parallel_layout"
_LAYOUT_LETTERS = "EtmL"  # embedding, transformer (decoder) layer, MTP layer, loss
_LAYOUT_MAX_LETTERS = 1_000_000


def is_uneven(parallel: ParallelConfig) -> bool:
    """Whether any of the uneven-split keys (the layout among them) is set."""
    return (
        parallel.pipeline_model_parallel_layout is not None
        or parallel.decoder_first_pipeline_num_layers is not None
        or parallel.decoder_last_pipeline_num_layers is not None
        or bool(parallel.account_for_embedding_in_pipeline_split)
        or bool(parallel.account_for_loss_in_pipeline_split)
    )


def stage_layers(
    model: ModelSpec, parallel: ParallelConfig, placement: str = LOOPED
) -> tuple[tuple[int, ...], ...]:
    """Layers per virtual stage as Megatron-Core splits them, checked.

    Under DualPipe's ``dual`` placement each of the two model copies is a pipeline of p
    stages split as one chunk per rank would be (the keys below with v = 1); rank r's
    chunk 0 holds stage r of copy 0 and its chunk 1 stage p - 1 - r of copy 1.

    Returns, for each pipeline rank r, a tuple of v counts: ``[r][k]`` is what chunk k of
    rank r holds, counting the embedding and the loss as one layer each where the
    ``account_for_*`` flags say so; `virtual_stage_layers` takes those off the chunks
    that hold virtual stages 0 and p v - 1 (which depends on the placement).

    Megatron-Core (megatron/core/transformer/transformer_block.py
    ``get_num_layers_to_build`` and transformer_layer.py ``get_transformer_layer_offset``,
    checked in transformer_config.py ``__post_init__``, 2024-2025):

    - none of the keys: L / p per rank, L / (p v) per chunk; p and p v must divide L;
    - ``decoder_first/last_pipeline_num_layers`` F, Z: the first (last) rank holds F (Z);
      the other ranks share the rest evenly; each rank's count is split evenly over its
      v chunks (F, Z and the middle count must be divisible by v); not together with
      the ``account_for_*`` flags;
    - ``account_for_embedding/loss_in_pipeline_split``: the embedding and the loss each
      count as one layer: (L + e + l) / (p v) per virtual stage, one fewer on virtual
      stage 0 (embedding) and on p v - 1 (loss); p must divide L + e + l and v the result.

    stepsim also needs every virtual stage to hold at least one layer (Megatron-Core allows
    an embedding-only stage; stepsim lowers the embedding with the first layer).
    """
    if parallel.pipeline_model_parallel_layout is not None:
        return layout_layers(model, parallel, placement)
    if placement == DUAL:
        copy = _stage_layers(model, parallel, 1)
        p = parallel.pipeline_model_parallel_size
        return tuple((copy[r][0], copy[p - 1 - r][0]) for r in range(p))
    return _stage_layers(model, parallel, parallel.virtual_pipeline_model_parallel_size)


def _stage_layers(
    model: ModelSpec, parallel: ParallelConfig, v: int
) -> tuple[tuple[int, ...], ...]:
    L, p = model.num_layers, parallel.pipeline_model_parallel_size
    first, last = (
        parallel.decoder_first_pipeline_num_layers,
        parallel.decoder_last_pipeline_num_layers,
    )
    embedding = bool(parallel.account_for_embedding_in_pipeline_split)
    loss = bool(parallel.account_for_loss_in_pipeline_split)
    v_key = "parallel.virtual_pipeline_model_parallel_size"
    p_key = "parallel.pipeline_model_parallel_size"
    if first is not None or last is not None:
        edge_key, edge = (FIRST_KEY, first) if first is not None else (LAST_KEY, last)
        if embedding or loss:
            raise ScenarioError(
                key=edge_key,
                value=edge,
                rule="cannot be set together with parallel.account_for_embedding_in_pipeline_"
                "split or account_for_loss_in_pipeline_split (Megatron-Core refuses the mix)",
            )
        if p < 2:
            raise ScenarioError(key=edge_key, value=edge, rule=f"needs {p_key} > 1 (found {p})")
        for name, count in ((FIRST_KEY, first), (LAST_KEY, last)):
            if count is not None and count % v:
                raise ScenarioError(key=name, value=count, rule=f"must be divisible by {v_key}={v}")
        middle_ranks = p - (first is not None) - (last is not None)
        rest = L - (first or 0) - (last or 0)
        if middle_ranks == 0 and rest != 0:
            raise ScenarioError(
                key=edge_key,
                value=edge,
                rule=f"plus {LAST_KEY}={last} must equal model.num_layers={L} with "
                f"{p_key}={p} (no stage left between them)",
            )
        if middle_ranks and (rest < middle_ranks or rest % middle_ranks):
            raise ScenarioError(
                key=edge_key,
                value=edge,
                rule=f"leaves {rest} of model.num_layers={L} for the other {middle_ranks} "
                f"of {p_key}={p} stages, which must split them evenly, at least one each",
            )
        middle = rest // middle_ranks if middle_ranks else 0
        if middle % v:
            raise ScenarioError(
                key=v_key,
                value=v,
                rule=f"must divide the {middle} layers of each middle pipeline stage",
            )
        per_rank = [middle] * p
        if first is not None:
            per_rank[0] = first
        if last is not None:
            per_rank[-1] = last
        return tuple((count // v,) * v for count in per_rank)
    counted = L + embedding + loss
    if embedding or loss:
        extra = " + ".join(
            what
            for what, on in (("1 for the embedding", embedding), ("1 for the loss", loss))
            if on
        )
        if counted % p:
            raise ScenarioError(
                key=p_key,
                value=p,
                rule=f"must divide model.num_layers + {extra} = {counted} "
                "(account_for_*_in_pipeline_split)",
            )
        if counted // p % v:
            raise ScenarioError(
                key=v_key,
                value=v,
                rule=f"must divide the {counted // p} layers per pipeline stage counted with "
                f"account_for_*_in_pipeline_split",
            )
        if p * v > 1 and counted // (p * v) < 2:
            raise ScenarioError(
                key=p_key,
                value=p,
                rule=f"leaves a virtual stage without a transformer layer: {counted} counted "
                f"layers over {p * v} virtual stages, one fewer on the first and/or last",
            )
        per_chunk = counted // (p * v)
        return tuple((per_chunk,) * v for _ in range(p))
    if L % p:
        raise ScenarioError(
            key=p_key,
            value=p,
            rule=f"must divide model.num_layers={L}",
        )
    if L % (p * v):
        raise ScenarioError(
            f"parallel.virtual_pipeline_model_parallel_size={v} x "
            f"pipeline_model_parallel_size={p} must divide model.num_layers={L} "
            "(every chunk holds the same number of layers)",
            key=v_key,
            value=v,
            rule="x pipeline_model_parallel_size must divide model.num_layers",
        )
    return tuple((L // (p * v),) * v for _ in range(p))


def parse_layout(text: str) -> list[str]:
    """A pipeline layout string as Megatron-Core reads it
    (megatron/core/transformer/pipeline_parallel_layer_layout.py `parse_str_to_list`):
    commas dropped, ``(...)*n`` then ``x*n`` unrolled, then split at ``|`` into the
    virtual stages' layer letters (E, t, m, L). A one-line error names what is wrong."""
    too_long = ScenarioError(
        key=LAYOUT_KEY, value=text, rule=f"unrolls past {_LAYOUT_MAX_LETTERS:,} letters"
    )

    def repeat(match: re.Match[str]) -> str:
        # the count checked before the string is built: "t*10**12" must not allocate
        unit, digits = match.group(1), match.group(2)
        if len(digits) > 7 or len(unit) * int(digits) > _LAYOUT_MAX_LETTERS:
            raise too_long
        return unit * int(digits)

    unrolled = text.replace(",", "")
    for pattern in (r"\(([^()]+)\)\*(\d+)", r"(.)\*(\d+)"):
        unrolled = re.sub(pattern, repeat, unrolled)
        if len(unrolled) > _LAYOUT_MAX_LETTERS:
            raise too_long
    stages = unrolled.split("|")
    for stage in stages:
        for letter in stage:
            if letter not in _LAYOUT_LETTERS:
                raise ScenarioError(
                    key=LAYOUT_KEY,
                    value=text,
                    rule=f"has {letter!r} where a layer letter is expected: E (embedding), "
                    "t (transformer layer), m (multi-token prediction), L (loss); | between "
                    "stages, (...)*n and x*n to repeat",
                )
    return stages


def layout_layers(
    model: ModelSpec, parallel: ParallelConfig, placement: str
) -> tuple[tuple[int, ...], ...]:
    """`parallel.pipeline_model_parallel_layout`'s transformer and MTP layers per chunk,
    ``[r][k]``, checked as Megatron-Core checks a layout (`validate_layer_layout`): p
    divides the stages and v is the quotient, one embedding first and one loss last, as
    many `t` as `model.num_layers` and `m` as `model.mtp_num_layers`, MTP after every
    decoder layer. Virtual stage i is chunk i // p of rank i mod p (list index vpp x p +
    pp). stepsim lowers the embedding on virtual stage 0 and the loss on the last, and
    needs a layer on every other stage."""
    text = parallel.pipeline_model_parallel_layout
    assert text is not None  # called when the layout is set
    p, v = parallel.pipeline_model_parallel_size, parallel.virtual_pipeline_model_parallel_size
    others = (
        ("parallel.decoder_first_pipeline_num_layers", parallel.decoder_first_pipeline_num_layers),
        ("parallel.decoder_last_pipeline_num_layers", parallel.decoder_last_pipeline_num_layers),
        (
            "parallel.account_for_embedding_in_pipeline_split",
            parallel.account_for_embedding_in_pipeline_split,
        ),
        (
            "parallel.account_for_loss_in_pipeline_split",
            parallel.account_for_loss_in_pipeline_split,
        ),
    )
    for name, value in others:
        if value:
            raise ScenarioError(
                key=LAYOUT_KEY, value=text, rule=f"cannot be set together with {name}"
            )
    if placement != LOOPED:
        raise ScenarioError(
            key=LAYOUT_KEY,
            value=text,
            rule="applies to the looped schedules (1f1b, interleaved, ...); not to "
            f"{placement!r} placements (use decoder_first/last_pipeline_num_layers)",
        )
    stages = parse_layout(text)
    if len(stages) != p * v:
        raise ScenarioError(
            key=LAYOUT_KEY,
            value=text,
            rule=f"has {len(stages)} stages; it needs pipeline_model_parallel_size x "
            f"virtual_pipeline_model_parallel_size = {p} x {v} = {p * v}",
        )
    flat = "".join(stages)
    mtp = model.mtp_num_layers or 0
    problem = None
    if flat.count("E") != 1 or not stages[0].startswith("E"):
        problem = "must begin the first stage with the one embedding E"
    elif flat.count("L") != 1 or not stages[-1].endswith("L"):
        problem = "must end the last stage with the one loss L"
    elif flat.count("t") != model.num_layers:
        problem = f"has {flat.count('t')} t; model.num_layers={model.num_layers}"
    elif flat.count("m") != mtp:
        problem = f"has {flat.count('m')} m; model.mtp_num_layers={mtp}"
    elif "m" in flat and "t" in flat[flat.index("m") :]:
        problem = "must place the decoder layers t before the MTP layers m"
    else:
        for i, stage in enumerate(stages[1:-1], 1):
            if not stage:
                problem = f"leaves virtual stage {i} empty (stepsim needs a layer there)"
                break
    if problem:
        raise ScenarioError(key=LAYOUT_KEY, value=text, rule=problem)
    counts = [stage.count("t") + stage.count("m") for stage in stages]
    return tuple(tuple(counts[k * p + r] for k in range(v)) for r in range(p))


def virtual_stage_layers(
    model: ModelSpec, parallel: ParallelConfig, placement: str
) -> tuple[tuple[int, ...], ...]:
    """`stage_layers` with the embedding's and the loss's layer taken off the chunks that
    hold virtual stages 0 and p v - 1 under ``placement`` (schedules.holder_of), and the
    multi-token-prediction layers (`model.mtp_num_layers`) added to the last: ``[r][k]``
    is the transformer layers of chunk k of rank r. A pipeline layout gives them
    itself (`layout_layers`)."""
    if parallel.pipeline_model_parallel_layout is not None:
        return layout_layers(model, parallel, placement)
    counts = [list(chunks) for chunks in stage_layers(model, parallel, placement)]
    p = parallel.pipeline_model_parallel_size
    v = parallel.virtual_pipeline_model_parallel_size
    # the virtual stages holding an embedding and a loss: under `dual` each copy's ends
    firsts, lasts = ([0, p], [p - 1, 2 * p - 1]) if placement == DUAL else ([0], [p * v - 1])
    if parallel.account_for_embedding_in_pipeline_split:
        for virtual in firsts:
            rank, chunk = holder_of(virtual, p, placement)
            counts[rank][chunk] -= 1
    if parallel.account_for_loss_in_pipeline_split:
        for virtual in lasts:
            rank, chunk = holder_of(virtual, p, placement)
            counts[rank][chunk] -= 1
    # multi-token prediction: its transformer layers sit with the loss, after the decoder's
    # (Megatron-Core's default without a pipeline layout: the last virtual stage; under
    # `dual` each copy's)
    for virtual in lasts if model.mtp_num_layers else ():
        rank, chunk = holder_of(virtual, p, placement)
        counts[rank][chunk] += model.mtp_num_layers or 0
    return tuple(tuple(chunks) for chunks in counts)


def check_dual(training: TrainingConfig) -> None:
    """What DualPipe's two model copies need of the rest, as stepsim lowers them: untied
    embeddings (each end rank holds an embedding and an output layer of different
    copies), and whole gradients until the copies' sum after the flush (not ZeRO-2's or
    FSDP's per-micro-batch reduce-scatters)."""
    if training.share_embeddings_and_output_weights:
        raise ScenarioError(
            key="training.share_embeddings_and_output_weights",
            value=True,
            rule="must be false with training.schedule='dualpipe' (tied embeddings across "
            "its two model copies are not modelled)",
        )
    sharding = training.data_parallel_sharding
    if sharding in (SHARD_GRADIENTS, SHARD_FULL):
        raise ScenarioError(
            key="training.data_parallel_sharding",
            value=sharding,
            rule="must be `none` or `optimizer` with training.schedule='dualpipe' (its copies' "
            "gradients are summed after the flush, before the data-parallel sync)",
        )
