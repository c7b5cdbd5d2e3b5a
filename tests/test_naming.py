"""Key templates (``django_redislock.naming``): every field is checked when the function is
decorated — fields nested in a format spec too — and filled from the bound arguments."""

from __future__ import annotations

from typing import Any

import pytest

from django_redislock import distributed_lock, get_lock_info
from django_redislock.celery.keys import key_function
from django_redislock.naming import compile_key, template_fields


def test_a_field_nested_in_a_format_spec_fails_at_decoration_time():
    with pytest.raises(ValueError, match=r"'j:\{x:\{width\}\}'.*'width'"):

        @distributed_lock("j:{x:{width}}")
        def job(x: int) -> None: ...


def test_a_field_nested_after_a_conversion_fails_at_decoration_time():
    with pytest.raises(ValueError, match="'fill'"):

        @distributed_lock("j:{x!r:{fill}>8}")
        def job(x: int) -> None: ...


def test_a_field_nested_in_a_format_spec_is_filled_from_the_arguments():
    seen: list[str] = []

    @distributed_lock("j:{x:0{width}d}:{name!r:>{pad}}", timeout=5)
    def job(x: int, name: str, width: int = 4, pad: int = 5) -> None:
        seen.extend(i.name for i in __import__("django_redislock").list_locks())

    job(7, "ab")
    assert seen == ["j:0007: 'ab'"]
    assert job.lock_name(7, "ab", width=2) == "j:07: 'ab'"  # type: ignore[attr-defined]


def test_attribute_and_index_chains_work_in_nested_fields():
    class Options:
        sizes = {"id": 3}

    def job(pk: int, opts: Any, **options: Any) -> None: ...

    name_of = compile_key("j:{pk:0{opts.sizes[id]}}:{options[mode]!s:.{opts.sizes[id]}}", job)
    assert name_of(5, Options(), mode="fullsync") == "j:005:ful"
    with pytest.raises(ValueError, match="'sizes'"):
        compile_key("j:{pk:{sizes[id]}}", job)


def test_conversions_are_checked_and_applied():
    assert compile_key("j:{x!r}", lambda x: None)("a") == "j:'a'"
    assert compile_key("j:{x!a}", lambda x: None)("é") == "j:'\\xe9'"
    with pytest.raises(ValueError, match="!z"):
        compile_key("j:{x!z}", lambda x: None)
    with pytest.raises(ValueError, match="!z"):
        compile_key("j:{x:{w!z}}", lambda x, w: None)


def test_positional_nested_fields_fail_at_decoration_time():
    for template in ("j:{x:{}}", "j:{x:{0}}"):
        with pytest.raises(ValueError, match="positional"):
            compile_key(template, lambda x: None)


def test_fields_nested_deeper_than_str_format_allows_fail_at_decoration_time():
    """``str.format`` fills one level of nesting and raises at the call beyond that."""
    with pytest.raises(ValueError, match="nested"):
        compile_key("j:{x:{w:{z}}}", lambda x, w, z: None)


def test_a_malformed_template_names_itself():
    with pytest.raises(ValueError, match=r"'j:\{x'"):
        compile_key("j:{x", lambda x: None)
    with pytest.raises(ValueError, match=r"'j:\{x:\{w\}'"):
        compile_key("j:{x:{w}", lambda x, w: None)


def test_template_fields_lists_nested_roots():
    assert template_fields("a:{x.y:{w[0]}}:{z!r:>{pad}}") == ["x", "w", "z", "pad"]


def test_celery_lock_key_templates_check_nested_fields_too():
    """``SingleFlightTask`` compiles ``lock_key`` with the same code when the task is created."""

    class Sync:
        def run(self, account_id: int, width: int = 3) -> None: ...

    with pytest.raises(ValueError, match="'size'"):
        key_function(Sync, "sync:{account_id:0{size}}")
    key = key_function(Sync, "sync:{account_id:0{width}}")
    assert key is not None and key(None, (7,), {}) == "sync:007"


def test_the_name_of_a_nested_template_is_the_lock_taken():
    @distributed_lock("n:{x:>{w}}", timeout=5)
    def job(x: str, w: int) -> bool:
        return get_lock_info("n:  a") is not None

    assert job("a", 3) is True
