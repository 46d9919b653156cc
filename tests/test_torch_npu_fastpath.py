"""The per-op tables the drop-in precomputes (argument kinds, schema defaults, accepted names)
give the same binding and the same errors as reading the schema on every call."""

import pytest

torch = pytest.importorskip("torch")

import ascend_emu.torch_npu as torch_npu  # noqa: E402
from ascend_emu.errors import DTypeError, ModeError  # noqa: E402
from ascend_emu.torch_npu import _registry  # noqa: E402
from ascend_emu.torch_npu.schemas import SCHEMAS  # noqa: E402


def _schema(spec):
    return torch._C.parse_schema(f"{spec.namespace}::{spec.schema}")


@pytest.mark.parametrize("spec", SCHEMAS, ids=lambda s: s.qualified)
def test_bind_with_precomputed_defaults_matches_schema(spec):
    schema = _schema(spec)
    names = tuple(a.name for a in schema.arguments)
    args = tuple(object() for _ in names[:2])
    kwargs = {names[-1]: "kw"} if len(names) > 2 else {}
    expected = _registry._bind(schema, args, kwargs)
    got = _registry._bind(schema, args, kwargs, _registry._defaults(schema), names)
    assert got == expected
    assert list(got) == list(names)  # every schema argument, in schema order
    assert got[names[0]] is args[0]


@pytest.mark.parametrize("spec", SCHEMAS, ids=lambda s: s.qualified)
def test_kind_table_follows_schema_types(spec):
    schema = _schema(spec)
    table = _registry._kind_table(schema)
    assert [row[0] for row in table] == [a.name for a in schema.arguments]
    for (name, kind, optional), arg in zip(table, schema.arguments):
        assert str(arg.type) == (f"Optional[{kind}]" if optional else kind)


def test_kind_errors_name_the_argument_positional_and_keyword():
    fn = torch_npu.npu_kv_rmsnorm_rope_cache
    kv = torch.zeros(1, 1, 1, 576, dtype=torch.bfloat16)
    with pytest.raises(DTypeError, match="kv: expected a torch.Tensor"):
        fn([1.0], kv, kv, kv, kv, kv, kv)
    with pytest.raises(DTypeError, match="epsilon: expected a Python float"):
        fn(kv, kv, kv, kv, kv, kv, kv, epsilon="x")
    with pytest.raises(ModeError, match="cache_mode: expected a str"):
        fn(kv, kv, kv, kv, kv, kv, kv, cache_mode=3)
    with pytest.raises(TypeError, match="takes at most"):
        fn(*([kv] * 40))


def test_accepted_names_are_the_ops_signature():
    import inspect

    from ascend_emu.torch_npu._convert import resolve_op

    fn = resolve_op("npu_kv_rmsnorm_rope_cache")
    assert _registry._accepted(fn) == frozenset(inspect.signature(fn).parameters)
    assert _registry._accepted(fn) is _registry._accepted(fn)  # read once per op
