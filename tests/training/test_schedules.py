"""TempBalance, AlphaDecay and LayerwiseLR on a tiny Llama built from a config: each
module's learning rate or weight decay is the mapping written out by hand for the alphas
the schedule computed, those alphas are ``diffract analyze``'s of the same weights (and
the authors' median Hill estimator), they reach the optimizer at the step they were
analysed, ``close()`` gives the groups back as they were, and the optimizer's checkpoints
keep the user's layout. Bad input is refused before training."""

from __future__ import annotations

import copy

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from diffract import Session  # noqa: E402
from diffract.errors import InvalidArgumentError  # noqa: E402
from diffract_training import AlphaDecay, LayerwiseLR, TempBalance  # noqa: E402

LR, WD = 1e-3, 0.1


def _llama():
    config = transformers.LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=128,
                                      num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, max_position_embeddings=32)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config)


def _train_step(model, optimizer, step: int) -> None:
    ids = torch.randint(0, 96, (4, 12), generator=torch.Generator().manual_seed(step))
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    optimizer.zero_grad()


def _layout(optimizer):
    return [([id(p) for p in g["params"]], {k: v for k, v in g.items() if k != "params"})
            for g in optimizer.param_groups]


def _group_of(optimizer, param):
    return next(g for g in optimizer.param_groups if any(p is param for p in g["params"]))


def _engine_alphas(weights: dict) -> dict:
    """pl_alpha_hill of each matrix, from a Session of its own (diffract analyze's)."""
    with Session() as s:
        s.models.add(weights, "m", copy_weights=True)
        s.compute.apply("pl_alpha_hill")
        table = s.results.export_metrics("pl_alpha_hill")["m"]
    return {n: row["pl_alpha_hill"] for n, row in table.items()}


def _median_hill(weight: np.ndarray) -> float:
    """The authors' ``pl_fitting='median'`` (xmin_pos 2), written out."""
    eigs = np.sort(np.linalg.svd(weight.astype(np.float64), compute_uv=False) ** 2)
    i = len(eigs) // 2
    n = len(eigs) - i
    return 1 + n / (np.sum(np.log(eigs[i:])) - n * np.log(eigs[i]))


def _matrices(model) -> dict:
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.dim() == 2}


# -- the mapping, by hand ---------------------------------------------------------------
def test_the_linear_map_for_a_few_alphas_written_out():
    tb = TempBalance(every=10)
    assert tb.mapping({"a": 2.0, "b": 3.0, "c": 4.0}) == {"a": 0.5, "b": 1.0, "c": 1.5}
    assert tb.mapping({"a": 2.0, "b": 2.5}) == {"a": 0.5, "b": 1.5}
    ad = AlphaDecay()
    assert ad.mapping({"a": 2.0, "b": 6.0, "c": 3.0}) == pytest.approx(
        {"a": 0.6666, "b": 5.0, "c": 0.6666 + 0.25 * (5.0 - 0.6666)}, rel=1e-15)
    llr = LayerwiseLR()
    assert llr.mapping({"a": 3.0, "b": 5.0, "c": 4.0}) == {"a": 1.0, "b": 5.0, "c": 3.0}
    assert llr.mapping({"a": 3.0, "b": 3.0}) == {"a": 3.0, "b": 3.0}  # all equal: the middle
    assert llr.mapping({"a": 3.0}) == {}  # one alpha balances nothing



def test_tempbalances_other_assignment_functions_written_out():
    """tb_sqrt and tb_log2: n g(alpha) / sum g, a mean factor of 1 (the ratios unread);
    tb_step: the i-th smallest of n gets low + (high - low) i / n, ties their mean."""
    sqrt = TempBalance(every=10, assign_func="tb_sqrt", lr_min_ratio=0.9, lr_max_ratio=1.1)
    assert sqrt.mapping({"a": 4.0, "b": 9.0, "c": 16.0}) == pytest.approx(
        {"a": 6 / 9, "b": 1.0, "c": 12 / 9}, rel=1e-15)
    log2 = TempBalance(every=10, assign_func="tb_log2")
    assert log2.mapping({"a": 2.0, "b": 4.0, "c": 8.0}) == pytest.approx(
        {"a": 0.5, "b": 1.0, "c": 1.5}, rel=1e-15)
    step = TempBalance(every=10, assign_func="tb_step")
    assert step.mapping({"a": 5.0, "b": 2.0, "c": 3.0, "d": 9.0}) == {
        "a": 1.0, "b": 0.5, "c": 0.75, "d": 1.25}
    assert step.mapping({"a": 3.0, "b": 2.0, "c": 3.0}) == pytest.approx(
        {"a": 1.0, "b": 0.5, "c": 1.0}, rel=1e-15)  # 0.5 + 1/3 and 0.5 + 2/3 shared
    with pytest.raises(InvalidArgumentError, match="assign_func takes one of tb_linear_map"):
        TempBalance(every=10, assign_func="tb_sigmoid")

# -- TempBalance ------------------------------------------------------------------------
def test_tempbalance_sets_each_module_lr_from_its_alpha_at_the_analysed_step():
    model = _llama()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WD)
    linears = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
    # as the authors: first and last Linear left out, and any with under 50 eigenvalues
    # (k_proj and v_proj: 2 kv heads x 16 = 32 rows)
    want = [n for n in linears[1:-1] if not n.endswith(("k_proj", "v_proj"))]
    weights = _matrices(model)
    tb = TempBalance(model, optimizer, every=2, background=False)
    try:
        assert tb.analysed == want and tb.modules == want
        for step in range(0, 5):
            if step:
                _train_step(model, optimizer, step)
                weights = _matrices(model)  # the weights analysed at this step
                tb.step(step)
            analysed = 2 * (step // 2)
            engine = _engine_alphas(weights) if step == analysed else None
            alphas = {m: tb.alphas[m][1] for m in want}
            assert {tb.alphas[m][0] for m in want} == {analysed}
            if engine is not None:
                assert alphas == {m: engine[f"{m}.weight"] for m in want}
            lo, hi = min(alphas.values()), max(alphas.values())
            for m in want:
                weight = model.get_submodule(m).weight
                by_hand = LR * (0.5 + (alphas[m] - lo) / (hi - lo) * (1.5 - 0.5))
                assert _group_of(optimizer, weight)["lr"] == pytest.approx(by_hand, rel=1e-12)
            first = model.get_submodule(linears[0]).weight
            assert _group_of(optimizer, first)["lr"] == LR  # left at the user's value
        one = want[0]
        assert tb.alphas[one][1] == pytest.approx(
            _median_hill(model.get_submodule(one).weight.detach().numpy()), rel=1e-6)
    finally:
        tb.close()


def test_close_gives_the_groups_back_and_a_scheduler_built_before_keeps_working():
    model = _llama()
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    rest = [p for n, p in model.named_parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decay}, {"params": rest, "weight_decay": 0.0}],
                                  lr=LR, weight_decay=WD)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1 / (1 + s))
    before = _layout(optimizer)
    tb = TempBalance(model, optimizer, every=2, background=False)
    assert len(optimizer.param_groups) == 2 + len(tb.modules)
    for step in range(1, 4):
        _train_step(model, optimizer, step)
        scheduler.step()
        tb.step(step)
        base = scheduler.get_last_lr()[0]
        assert base == pytest.approx(LR / (1 + step))
        weight = model.get_submodule(tb.modules[0]).weight
        assert _group_of(optimizer, weight)["lr"] == pytest.approx(
            base * tb.factors[tb.modules[0]], rel=1e-12)  # the user's schedule is the scale
    tb.close()
    after = _layout(optimizer)
    assert [ids for ids, _ in after] == [ids for ids, _ in before]
    assert [{k: v for k, v in h.items() if k not in ("lr",)} for _, h in after] == \
        [{k: v for k, v in h.items() if k not in ("lr",)} for _, h in before]
    assert len(scheduler.base_lrs) == 2
    _train_step(model, optimizer, 9)
    scheduler.step()  # strict about its groups: it sees the user's two again


def test_the_optimizer_checkpoint_keeps_the_users_layout():
    model = _llama()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WD)
    tb = TempBalance(model, optimizer, every=2, background=False)
    for step in range(1, 3):
        _train_step(model, optimizer, step)
        tb.step(step)
    saved = copy.deepcopy(optimizer.state_dict())
    assert len(saved["param_groups"]) == 1  # as the optimizer without the schedule
    plain = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WD)
    plain.load_state_dict(saved)
    for p in model.parameters():
        assert torch.equal(plain.state[p]["exp_avg"], optimizer.state[p]["exp_avg"])
    # and a run resumed with the schedule takes the plain checkpoint
    other = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WD)
    again = TempBalance(model, other, every=2, background=False)
    try:
        other.load_state_dict(saved)
        assert len(other.param_groups) == len(optimizer.param_groups)
        for p in model.parameters():
            assert torch.equal(other.state[p]["exp_avg_sq"], optimizer.state[p]["exp_avg_sq"])
        # torch put new dicts in place of the groups: the schedule still sets them (it
        # set the old ones, which the optimizer no longer holds, before)
        again.step(3)
        factors = again.factors
        assert len(set(factors.values())) > 1
        named = dict(model.named_modules())
        for module, factor in factors.items():
            assert _group_of(other, named[module].weight)["lr"] == LR * factor, module
        again.close()
        assert len(other.param_groups) == 1
        assert {id(p) for p in other.param_groups[0]["params"]} == {
            id(p) for p in model.parameters()}
    finally:
        again.close()
        tb.close()


# -- AlphaDecay -------------------------------------------------------------------------
def test_alphadecay_sets_weight_decay_and_a_no_decay_group_keeps_none():
    model = _llama()
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decay}, {"params": rest, "weight_decay": 0.0}],
                                  lr=LR, weight_decay=WD)
    ad = AlphaDecay(model, optimizer, every=3, background=False)
    try:
        for step in range(1, 4):
            _train_step(model, optimizer, step)
            ad.step(step)
        alphas = {m: a for m, (s, a) in ad.alphas.items()}
        assert {s for s, _ in ad.alphas.values()} == {3}
        lo, hi = min(alphas.values()), max(alphas.values())
        for m in ad.modules:
            by_hand = WD * (0.6666 + (alphas[m] - lo) / (hi - lo) * (5.0 - 0.6666))
            weight = model.get_submodule(m).weight
            assert _group_of(optimizer, weight)["weight_decay"] == pytest.approx(
                by_hand, rel=1e-12)
            assert _group_of(optimizer, weight)["lr"] == LR
        norm = model.model.norm.weight
        assert _group_of(optimizer, norm)["weight_decay"] == 0.0
    finally:
        ad.close()


# -- LayerwiseLR ------------------------------------------------------------------------
def test_layerwise_lr_ramps_to_its_targets_and_pins_embeddings_and_head():
    model = _llama()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WD)
    llr = LayerwiseLR(model, optimizer, every=4, ramp=2, background=False)
    try:
        embed, head = model.model.embed_tokens.weight, model.lm_head.weight
        assert "model.embed_tokens" in llr.modules and "lm_head" in llr.modules
        assert "model.embed_tokens" not in llr.analysed
        seen = {}
        for step in range(1, 7):
            _train_step(model, optimizer, step)
            if step == 4:
                engine = _engine_alphas(_matrices(model))  # the weights analysed at 4
            llr.step(step)
            seen[step] = {m: _group_of(optimizer, model.get_submodule(m).weight)["lr"]
                          for m in llr.analysed}
            assert _group_of(optimizer, head)["lr"] == pytest.approx(
                LR * (5.0 if step >= 2 else 1.0 + step / 2 * 4.0))
            assert _group_of(optimizer, embed)["lr"] == _group_of(optimizer, head)["lr"]
        first = {m: a for m, (s, a) in llr.alphas.items()}
        assert {s for s, _ in llr.alphas.values()} == {4}
        # the top of the range: the largest alpha of every module but the pinned ones
        # (k_proj and v_proj, under 50 eigenvalues, count though not balanced)
        lo = min(first.values())
        hi = max(a for n, a in engine.items() if "embed" not in n and "head" not in n)
        assert hi > max(first.values())
        new = {m: 1.0 + (a - lo) / (hi - lo) * 4.0 for m, a in first.items()}
        # the step-0 targets reached at step 2; the step-4 ones from step 4 over 2 steps
        old = {m: seen[3][m] / LR for m in llr.analysed}
        for m in llr.analysed:
            assert seen[4][m] == pytest.approx(LR * old[m], rel=1e-12)
            assert seen[5][m] == pytest.approx(LR * (old[m] + 0.5 * (new[m] - old[m])),
                                               rel=1e-12)
            assert seen[6][m] == pytest.approx(LR * new[m], rel=1e-12)
    finally:
        llr.close()


def test_layerwise_lr_with_muon_and_adamw_side_by_side():
    model = _llama()
    matrices = [p for n, p in model.named_parameters()
                if p.dim() == 2 and "embed" not in n and "lm_head" not in n]
    others = [p for p in model.parameters() if not any(p is q for q in matrices)]
    muon = torch.optim.Muon(matrices, lr=0.02)
    adamw = torch.optim.AdamW(others, lr=LR)
    llr = LayerwiseLR(model, [muon, adamw], every=2, ramp=0, background=False)
    try:
        for step in range(1, 3):
            ids = torch.randint(0, 96, (4, 12), generator=torch.Generator().manual_seed(step))
            model(input_ids=ids, labels=ids).loss.backward()
            muon.step()
            adamw.step()
            model.zero_grad()
            llr.step(step)
        q = model.model.layers[1].self_attn.q_proj.weight
        assert _group_of(muon, q)["lr"] == pytest.approx(0.02 * llr.factors[
            "model.layers.1.self_attn.q_proj"], rel=1e-12)
        assert _group_of(adamw, model.lm_head.weight)["lr"] == pytest.approx(LR * 5.0)
    finally:
        llr.close()
    assert len(muon.param_groups) == 1 and len(adamw.param_groups) == 1


# -- bad input, before training -----------------------------------------------------------
@pytest.mark.parametrize(("build", "says"), [
    (lambda m, o: TempBalance(m, o, every=0), "every takes"),
    (lambda m, o: TempBalance(m, o, every=2.5), "every takes"),
    (lambda m, o: TempBalance(m, o, every=4, lr_min_ratio=2.0, lr_max_ratio=1.0), "is below"),
    (lambda m, o: LayerwiseLR(m, o, every=10, ramp=20), "ramp (20) is longer"),
    (lambda m, o: AlphaDecay(m, o, wd_max_ratio=float("nan")), "a multiple from 0 to 1e+06"),
    (lambda m, o: TempBalance(m, None, every=4), "together"),
    (lambda m, o: TempBalance(m, object(), every=4), "torch.optim.Optimizer"),
    (lambda m, o: TempBalance(m, o, every=4, min_eigenvalues=10**6), "remain to be analysed"),
    (lambda m, o: AlphaDecay(m, torch.optim.Rprop(m.parameters())), "'weight_decay'"),
    (lambda m, o: TempBalance(m, torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=1.0),
                              every=4), "holds no parameter"),
])
def test_bad_input_is_refused_before_training(build, says):
    model = _llama()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    before = _layout(optimizer)
    with pytest.raises(InvalidArgumentError, match=r".*" + __import__("re").escape(says)):
        build(model, optimizer)
    assert _layout(optimizer) == before  # nothing split, nothing lost


def test_a_model_without_matrices_is_refused():
    model = torch.nn.Sequential(torch.nn.LayerNorm(8), torch.nn.Embedding(4, 8))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(InvalidArgumentError, match="0 of the model's 0"):
        TempBalance(model, optimizer, every=2)


# -- in the trainers ----------------------------------------------------------------------
class _Tokens(torch.utils.data.Dataset):
    def __init__(self, n: int = 64) -> None:
        self.ids = torch.randint(0, 96, (n, 12), generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def _hf_trainer(out, steps, schedule, record, logged=None):
    from diffract_training import DiffractCallback

    class _Record(transformers.TrainerCallback):
        def on_step_end(self, args, state, control, optimizer=None, lr_scheduler=None, **kw):
            record.append((state.global_step, dict(schedule.alphas), lr_scheduler.get_last_lr(),
                           [(list(g["params"]), g["lr"]) for g in optimizer.param_groups]))

        def on_log(self, args, state, control, logs=None, **kw):
            if logged is not None:
                logged.append(dict(logs or {}))

    args = transformers.TrainingArguments(
        output_dir=str(out), max_steps=steps, per_device_train_batch_size=4, learning_rate=1e-2,
        lr_scheduler_type="linear", save_strategy="steps", save_steps=2, logging_steps=100,
        report_to=[], use_cpu=True, seed=0, data_seed=0, disable_tqdm=True)
    return transformers.Trainer(
        model=_llama(), args=args, train_dataset=_Tokens(),
        callbacks=[_Record(), DiffractCallback(every=None, schedules=[schedule])])


def test_tempbalance_in_the_hf_trainer_as_its_docs_pass_callbacks(tmp_path):
    record: list = []
    logged: list = []
    schedule = TempBalance(every=2, background=False)
    trainer = _hf_trainer(tmp_path / "out", 4, schedule, record, logged)
    trainer.train()
    assert [r[0] for r in record] == [1, 2, 3, 4]
    # every=None: the callback monitors nothing of its own, the final weights included
    assert logged and not [k for logs in logged for k in logs if k.startswith("diffract/")]
    for step, alphas, base, groups in record:
        assert {s for s, _ in alphas.values()} == {2 * (step // 2)}
        values = {m: a for m, (_, a) in alphas.items()}
        lo, hi = min(values.values()), max(values.values())
        named = dict(trainer.model.named_parameters())
        for m in schedule.modules:
            weight = named[f"{m}.weight"]
            lr = next(lr for params, lr in groups if any(p is weight for p in params))
            assert lr == pytest.approx(base[0] * (0.5 + (values[m] - lo) / (hi - lo)), rel=1e-12)
    assert len(trainer.optimizer.param_groups) == 2  # the Trainer's decay / no-decay, back
    # a run resumed from the Trainer's checkpoint (optimizer saved in its own layout)
    record2: list = []
    again = _hf_trainer(tmp_path / "out", 4, TempBalance(every=2, background=False), record2)
    again.train(resume_from_checkpoint=str(tmp_path / "out" / "checkpoint-2"))
    assert [r[0] for r in record2] == [3, 4]
    assert {s for s, _ in record2[0][1].values()} == {2}  # the weights it resumed from


def test_a_resumed_trainer_run_keeps_its_schedules_factors(tmp_path):
    """LayerwiseLR's ramp and targets are saved beside each checkpoint the trainer writes
    and restored when it resumes: at every step after the resume the factors are the
    uninterrupted run's (before, the resumed run ramped again from 1x, and its first
    factors were the resumed weights' mapping)."""
    from diffract_training.hf import SCHEDULES_FILE

    def run(record, resume=None):
        schedule = LayerwiseLR(every=4, ramp=4, min_eigenvalues=0, background=False)

        class _Factors(transformers.TrainerCallback):
            def on_step_end(self, args, state, control, **kw):
                record[state.global_step] = dict(schedule.factors)

        trainer = _hf_trainer(tmp_path / "out", 10, schedule, [])
        trainer.add_callback(_Factors())
        trainer.train(resume_from_checkpoint=resume)

    whole: dict = {}
    run(whole)
    saved = tmp_path / "out" / "checkpoint-6" / SCHEDULES_FILE
    assert saved.is_file()
    resumed: dict = {}
    run(resumed, str(tmp_path / "out" / "checkpoint-6"))
    assert sorted(resumed) == [7, 8, 9, 10]
    assert len(set(whole[7].values())) > 2  # mid-ramp, moving
    for step in (7, 8, 9, 10):
        assert resumed[step] == whole[step], step
    # a state file of other schedules is refused, naming both
    saved.write_text('{"schedules": [{"kind": "TempBalance", "state": {}}]}')
    with pytest.raises(InvalidArgumentError, match=r"\['TempBalance'\].*\['LayerwiseLR'\]"):
        run({}, str(tmp_path / "out" / "checkpoint-6"))
    import threading  # the refused run leaves no analysis thread behind

    assert not [t for t in threading.enumerate() if t.name.startswith("diffract-monitor")]


def test_schedule_state_that_would_wreck_a_run_is_refused():
    """load_state_dict checks what it takes as the constructor does: no NaN, negative or
    huge factor (NaN or negative rates: gradient ascent), whole steps, all keys (a
    truncated dict raised a raw KeyError), modules of this model; nothing changes."""
    model = _llama()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    with TempBalance(model, optimizer, every=2, background=False) as tb:
        good = tb.state_dict()
        module = tb.modules[0]
        before = [g["lr"] for g in optimizer.param_groups]
        for bad, says in [
            ({**good, "to": {**good["to"], module: float("nan")}}, "finite number"),
            ({**good, "to": {**good["to"], module: -1.0}}, "finite number"),
            ({**good, "from": {module: 1e300}}, "finite number"),
            ({**good, "to": {"no.such.module": 1.0}}, "does not set"),
            ({**good, "since": 1.5}, "not a step"),
            ({k: v for k, v in good.items() if k != "alphas"}, "takes what state_dict"),
            ({**good, "alphas": {module: [2, float("inf")]}}, "finite alpha"),
        ]:
            with pytest.raises(InvalidArgumentError, match=says):
                tb.load_state_dict(bad)
            assert [g["lr"] for g in optimizer.param_groups] == before
        tb.load_state_dict(good)
    with pytest.raises(InvalidArgumentError, match="from 0 to 1e"):
        TempBalance(every=2, lr_max_ratio=1e308)


def test_alphadecay_in_lightning(tmp_path):
    L = pytest.importorskip("lightning.pytorch")
    from diffract_training import DiffractLightningCallback

    record: list = []
    schedule = AlphaDecay(every=2, background=False)

    class _Net(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.net = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(4)])

        def training_step(self, batch, batch_idx):
            (x,) = batch
            return self.net(x).pow(2).mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.05, weight_decay=1e-3)

        def train_dataloader(self):
            x = torch.randn(64, 64, generator=torch.Generator().manual_seed(0))
            return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x), batch_size=8)

    class _Record(L.Callback):
        def on_train_batch_end(self, trainer, pl_module, *args):
            opt = trainer.optimizers[0]
            record.append((trainer.global_step, dict(schedule.alphas),
                           {m: _group_of(opt, pl_module.get_submodule(m).weight)["weight_decay"]
                            for m in schedule.modules}))

    net = _Net()
    trainer = L.Trainer(max_steps=4, accelerator="cpu", devices=1, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False,
                        callbacks=[DiffractLightningCallback(every=None, schedules=[schedule]),
                                   _Record()])
    trainer.fit(net)
    assert schedule.modules == ["net.1", "net.2"]
    for step, alphas, decays in record:
        assert {s for s, _ in alphas.values()} == {2 * (step // 2)}
        a, b = alphas["net.1"][1], alphas["net.2"][1]
        lo, hi = min(a, b), max(a, b)
        assert decays == pytest.approx({m: 1e-3 * (0.6666 + (x - lo) / (hi - lo) * 4.3334)
                                        for m, x in (("net.1", a), ("net.2", b))}, rel=1e-12)
    assert len(trainer.optimizers[0].param_groups) == 1


def test_two_schedules_on_one_optimizer_compose_and_close_in_reverse():
    """TempBalance's learning rates and AlphaDecay's weight decay on one AdamW: the
    second splits the first's groups, so a module gets both factors; closed last-first
    the groups are the user's again."""
    model = _llama()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WD)
    before = _layout(optimizer)
    tb = TempBalance(model, optimizer, every=2, background=False)
    ad = AlphaDecay(model, optimizer, every=2, background=False)
    for step in range(1, 3):
        _train_step(model, optimizer, step)
        tb.step(step)
        ad.step(step)
    for m in set(tb.modules) & set(ad.modules):
        group = _group_of(optimizer, model.get_submodule(m).weight)
        assert group["lr"] == pytest.approx(LR * tb.factors[m], rel=1e-12)
        assert group["weight_decay"] == pytest.approx(WD * ad.factors[m], rel=1e-12)
    ad.close()
    tb.close()
    assert _layout(optimizer) == before


def test_a_lightning_run_resumed_with_ckpt_path_keeps_its_schedules_factors(tmp_path):
    """Lightning keeps the callback's schedules in its checkpoints (the callback's
    state_dict); fit(ckpt_path=...) carries on with the uninterrupted run's factors."""
    L = pytest.importorskip("lightning.pytorch")
    from lightning.pytorch.callbacks import ModelCheckpoint

    from diffract_training import DiffractLightningCallback
    from tests.resources.lightning import module

    def net():
        torch.manual_seed(0)
        return module(torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(4)]))

    # six batches an epoch: step 6 ends one, so the resumed run sees the same data
    x = torch.randn(48, 64, generator=torch.Generator().manual_seed(0))
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x), batch_size=8)

    def run(record, ckpt=None):
        schedule = LayerwiseLR(every=4, ramp=4, min_eigenvalues=0, background=False)

        class _Record(L.Callback):
            def on_train_batch_end(self, trainer, *args):
                record[trainer.global_step] = dict(schedule.factors)

        trainer = L.Trainer(
            max_steps=10, accelerator="cpu", devices=1, logger=False,
            enable_progress_bar=False, enable_model_summary=False,
            callbacks=[DiffractLightningCallback(every=None, schedules=[schedule]), _Record(),
                       ModelCheckpoint(dirpath=tmp_path / "ck", every_n_train_steps=6,
                                       save_top_k=-1)])
        trainer.fit(net(), train_dataloaders=data, ckpt_path=ckpt)

    whole: dict = {}
    run(whole)
    (ckpt,) = [p for p in (tmp_path / "ck").iterdir() if "step=6" in p.name]
    resumed: dict = {}
    run(resumed, str(ckpt))
    assert sorted(resumed) == [7, 8, 9, 10] and len(set(whole[7].values())) > 2
    for step in (7, 8, 9, 10):
        assert resumed[step] == whole[step], step
