"""The modules a schedule sets without analysing them: a BatchNorm2d takes the value of
the conv it follows, by name (``bn`` -> ``conv``) or, with TempBalance's
``batchnorm_type='order'``, the Conv2d registered just before it; with ``layernorm=True``
a LayerNorm takes that of the linear layer registered just before it. Checked against a
transcription, in this file's words, of how the authors' code builds its ``bn_to_conv``
and ``ln_to_linear`` tables (YefanZhou/TempBalance's ``tempbalance.py``, the same in
hed-ucas/AlphaDecay and hed-ucas/Layer-wise-Learning-Rate), on a model where the two
BatchNorm rules disagree. The linear layers are the authors' ``isinstance(m, nn.Linear)``:
``nn.MultiheadAttention``'s ``out_proj`` (a subclass) is analysed and scheduled."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

from diffract.errors import InvalidArgumentError  # noqa: E402
from diffract_training import AlphaDecay, LayerwiseLR, TempBalance  # noqa: E402
from tests.training.test_schedules_authors import authors_mapping  # noqa: E402

LR, WD = 1e-3, 0.1


class _Net(nn.Module):
    """Registered in this order (the order both rules read): a BatchNorm before any conv;
    ``conv2``/``bn2`` (both rules agree); ``stage.0``/``stage.1`` (order only: no ``bn`` in
    the name) and ``stage.2``, a BatchNorm after a BatchNorm (neither); ``bn9``, whose
    named conv does not exist but which follows ``conv3`` by order; a LayerNorm after a
    Linear, one after MultiheadAttention's out_proj, and one after another LayerNorm."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.bn0 = nn.BatchNorm2d(3)
        self.conv1 = nn.Conv2d(3, 16, 3)
        self.conv2 = nn.Conv2d(16, 24, 3)
        self.bn2 = nn.BatchNorm2d(24)
        self.stage = nn.Sequential(nn.Conv2d(24, 24, 3), nn.BatchNorm2d(24), nn.BatchNorm2d(24))
        self.conv3 = nn.Conv2d(24, 32, 3)
        self.bn9 = nn.BatchNorm2d(32)
        self.proj = nn.Linear(96, 64)
        self.norm = nn.LayerNorm(64)
        self.attn = nn.MultiheadAttention(64, 4)
        self.attn_norm = nn.LayerNorm(64)
        self.extra_norm = nn.LayerNorm(64)
        self.out = nn.Linear(64, 80)
        with torch.no_grad():  # alphas spread apart, as training does
            for i, p in enumerate(p for p in self.parameters() if p.dim() >= 2):
                p.mul_(torch.linspace(0.2, 1 + 0.3 * (i % 5), p.shape[1]).view(
                    1, -1, *([1] * (p.dim() - 2))) ** (1 + i % 3))


def _authors_followers(model, batchnorm, batchnorm_type, layernorm) -> dict[str, str]:
    """follower module -> leader module, as the authors' tables (a BatchNorm before any
    conv, where their ``type_lst[-1]`` fails, follows none)."""
    out = {}
    modules = list(model.named_modules())
    if batchnorm and batchnorm_type == "name":
        leaders = [n for n, m in modules if isinstance(m, (nn.Conv2d, nn.Linear))]
        out |= {n: n.replace("bn", "conv") for n, m in modules
                if isinstance(m, nn.BatchNorm2d) and n.replace("bn", "conv") in leaders}
    for on, leader_type, follower_type in (
            (batchnorm and batchnorm_type == "order", nn.Conv2d, nn.BatchNorm2d),
            (layernorm, nn.Linear, nn.LayerNorm)):
        if not on:
            continue
        names, kinds = [], []
        for n, m in modules:
            if isinstance(m, leader_type):
                names.append(n)
                kinds.append("leader")
            if isinstance(m, follower_type):
                if kinds and kinds[-1] == "leader":
                    out[n] = names[-1]
                names.append(n)
                kinds.append("follower")
    return out


CASES = [
    ("TempBalance", {}),
    ("TempBalance", {"batchnorm_type": "order"}),
    ("TempBalance", {"batchnorm_type": "order", "layernorm": True}),
    ("TempBalance", {"batchnorm": False, "layernorm": True}),
    ("AlphaDecay", {"layernorm": True}),
    ("LayerwiseLR", {"layernorm": True}),
]


@pytest.mark.parametrize(("kind", "options"), CASES,
                         ids=[f"{k}-{'-'.join(f'{a}={b}' for a, b in o.items()) or 'defaults'}"
                              for k, o in CASES])
def test_followers_take_the_value_of_the_module_the_authors_tables_name(kind, options):
    model = _Net()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WD)
    schedule_type = {"TempBalance": TempBalance, "AlphaDecay": AlphaDecay,
                     "LayerwiseLR": LayerwiseLR}[kind]
    extra = {"ramp": 0} if kind == "LayerwiseLR" else {}
    schedule = schedule_type(model, optimizer, every=10, background=False, min_eigenvalues=0,
                             remove_first=False, remove_last=False, **extra, **options)
    try:
        computed = [n for n, m in model.named_modules()
                    if isinstance(m, (nn.Conv2d, nn.Linear))]
        assert "attn.out_proj" in computed and schedule.analysed == computed
        alphas = {m: a for m, (_, a) in schedule.alphas.items()}
        want = authors_mapping([(n, alphas[n], 1) for n in computed], low=schedule.low,
                               high=schedule.high, remove_first=False, remove_last=False,
                               eigs_thresh=0)
        assert len(set(want.values())) > 2
        follows = _authors_followers(model, options.get("batchnorm", kind != "LayerwiseLR"),
                                     options.get("batchnorm_type", "name"),
                                     options.get("layernorm", False))
        key, base = ("weight_decay", WD) if kind == "AlphaDecay" else ("lr", LR)
        for name, module in model.named_modules():
            own = list(module.parameters(recurse=False))
            if not own or name == "attn":  # attn's in_proj: no Linear, the user's value
                continue
            factor = want.get(name, want.get(follows.get(name, ""), 1.0))
            for p in own:
                group = next(g for g in optimizer.param_groups
                             if any(q is p for q in g["params"]))
                assert group[key] / base == pytest.approx(factor, rel=1e-12), name
        # the rules disagree on this model, so each case checks what it claims
        if options.get("batchnorm_type") == "order":
            assert {"bn0", "stage.2"}.isdisjoint(follows) and follows["bn9"] == "conv3"
            assert follows["stage.1"] == "stage.0"
        elif options.get("batchnorm", kind != "LayerwiseLR"):
            assert follows.keys() & {"bn2", "bn9", "stage.1"} == {"bn2"}
        if options.get("layernorm"):
            assert follows["norm"] == "proj" and follows["attn_norm"] == "attn.out_proj"
            assert "extra_norm" not in follows
    finally:
        schedule.close()


def test_a_batchnorm_type_other_than_name_or_order_is_refused():
    model = _Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    with pytest.raises(InvalidArgumentError, match="batchnorm_type takes 'name'"):
        TempBalance(model, optimizer, every=10, batchnorm_type="position")
    with pytest.raises(InvalidArgumentError, match="layernorm takes True or False"):
        AlphaDecay(model, optimizer, layernorm="yes")
