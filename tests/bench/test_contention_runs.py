"""bench/contention.py's run names: which runs an invocation makes and which pairs its
verdicts hold against each other (the one-queue model's rows, #15)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import contention


def test_the_default_invocation_is_unchanged() -> None:
    assert contention.run_names(False, False) == ["unmanaged", "managed"]
    ablate = contention.run_names(True, False)
    assert ablate[:2] == ["unmanaged", "managed"] and "old-defaults" in ablate
    assert not [n for n in ablate if "1q" in n]  # the model's rows only when asked


def test_one_queue_pairs_its_own_unmanaged_run_with_each_queued_variant() -> None:
    names = contention.run_names(False, True)
    assert names == ["unmanaged-1q-1t", "unmanaged-1q", "1q-1ch", "1q"]
    assert contention.pairs(names) == [
        ("unmanaged-1q-1t", "1q-1ch"), ("unmanaged-1q-1t", "1q"),
        ("unmanaged-1q", "1q-1ch"), ("unmanaged-1q", "1q")]
    ablate = contention.run_names(True, True)
    assert ablate[:4] == names and len(ablate) > 4
    for name in ablate[2:]:
        knobs = contention.VARIANTS[name]
        assert knobs["device_queue"] is True, name  # every managed row on the model
    assert contention.UNMANAGED["unmanaged-1q"] == {"device_queue": True}
    assert all(k["device_queue"] for n, k in contention.UNMANAGED.items() if "1q" in n)
    both = contention.pairs(["unmanaged", "managed", "unmanaged-1q", "1q-1ch"])
    assert both == [("unmanaged", "managed"), ("unmanaged-1q", "1q-1ch")]


def test_own_host_rows_add_a_second_driver_and_pair_with_unmanaged() -> None:
    """loader-own-host / bg-own-host (#15, iso17): a second [[driver]] with the first's
    keys, and each row held against the unmanaged run of its invocation."""
    cfg = contention.npud_config(dict(contention.VARIANTS["bg-own-host"]))
    first, second = cfg["driver"]
    assert second == {**first, "name": contention.SECOND_HOST}
    assert len(contention.npud_config({})["driver"]) == 1
    assert contention.VARIANTS["loader-own-host"]["own_host"] == ["loader"]
    names = ["unmanaged", "managed", "loader-own-host", "bg-own-host"]
    assert contention.pairs(names) == [("unmanaged", n) for n in names[1:]]
    assert contention.pairs(["managed", "bg-own-host"]) == []


def test_the_background_host_row_is_one_driver_entry_with_the_key() -> None:
    """rt+app+bg-host (#15, bghost21): rt+app+bg-own-host's keys as the product form, one
    [[driver]] entry with background_host (no second entry, no app pointed elsewhere),
    held against unmanaged like the hand-built row."""
    hand, product = (dict(contention.VARIANTS[n]) for n in ("rt+app+bg-own-host",
                                                            "rt+app+bg-host"))
    assert hand.pop("own_host") and product.pop("background_host") is True
    assert hand == product  # the same keys otherwise
    cfg = contention.npud_config({k: v for k, v in product.items()
                                  if k != "camera_realtime"} | {"background_host": True})
    [entry] = cfg["driver"]
    assert entry["background_host"] is True and entry["name"] == "reference"
    assert contention.pairs(["unmanaged", "rt+app+bg-host"]) == [("unmanaged",
                                                                  "rt+app+bg-host")]


def test_the_tuned_background_host_rows_give_the_lane_the_hand_built_second_hosts_keys(
        ) -> None:
    """rt+app+bg-host+here-normal+step-nice: bgtune21's best second-host keys as the
    product's [driver.background], one entry; with the embedder's spin as its twin row."""
    product = contention.VARIANTS["rt+app+bg-host+here-normal+step-nice"]
    hand = contention.VARIANTS["rt+app+bg-own-host+here-normal+step-nice"]
    assert product["background"] == hand["second_host"] == {
        "background_burst_here": "normal", "background_step_nice": 19}
    knobs = {k: v for k, v in product.items() if k != "camera_realtime"}
    [entry] = contention.npud_config(knobs)["driver"]
    assert entry["background_host"] is True and entry["background"] == product["background"]
    spin = contention.VARIANTS["rt+app+bg-host+here-normal+step-nice+embedder-spin"]
    assert spin == {**product, "embedder_spin_us": 1000}
    # The same keys on the entry itself (both hosts), the rows bench/README.md's lane table
    # measured.
    base = contention.VARIANTS["rt+app+bg-host"]
    on_entry = contention.VARIANTS["rt+app+bg-host+on-entry+here-normal+step-nice"]
    assert product == {**base, "background": product["background"]}
    assert on_entry == {**base, **product["background"]}


def test_the_embed22_rows_differ_from_their_base_in_the_follow_and_the_spin_only() -> None:
    """rt+app+bg-host+here-normal+step-nice+* (#15, embed22): "+follow" adds the lane's
    background_follow_us, "+spin-auto" the embedder app's adaptive spin (spin_us None);
    managed+spin-auto is npud's defaults with that spin."""
    base = contention.VARIANTS["rt+app+bg-host+here-normal+step-nice"]
    follow = contention.VARIANTS["rt+app+bg-host+here-normal+step-nice+follow"]
    assert follow == {**base, "background": {**base["background"],
                                             "background_follow_us": 500}}
    auto = contention.VARIANTS["rt+app+bg-host+here-normal+step-nice+spin-auto"]
    assert auto == {**base, "embedder_spin_us": "auto"}
    both = contention.VARIANTS["rt+app+bg-host+here-normal+step-nice+follow+spin-auto"]
    assert both == {**follow, "embedder_spin_us": "auto"}
    assert contention.VARIANTS["managed+spin-auto"] == {"embedder_spin_us": "auto"}
    piped = contention.VARIANTS["rt+app+bg-host+here-normal+step-nice+pipeline"]
    assert piped == {**base, "embedder_inflight": 2}
    knobs = dict(auto)
    assert contention.second_host.embedder_knobs(knobs) == {"spin_us": None}
    assert "embedder_spin_us" not in knobs
    assert contention.second_host.embedder_knobs({"embedder_spin_us": 1000}) == {
        "spin_us": 1000.0}
    assert contention.second_host.embedder_knobs(dict(base)) == {}


def test_slice_rows_offer_the_unmanaged_camera_the_same_slice() -> None:
    """slice-*+app (#15, slice18): the managed camera's own thread asks for the slice the
    unmanaged-slice row gives the unmanaged camera's, and each is held against it."""
    app = contention.UNMANAGED["unmanaged-slice"]["camera_slice_us"]
    rows = [n for n, k in contention.VARIANTS.items() if "camera_slice_us" in k]
    assert rows and all(contention.VARIANTS[n]["camera_slice_us"] == app for n in rows)
    names = ["unmanaged", "managed", "unmanaged-slice", "slice-100", "slice-100+app"]
    assert contention.pairs(names) == [("unmanaged", "managed"),
                                       ("unmanaged-slice", "slice-100+app")]
    cfg = contention.npud_config({"foreground_slice_us": 100})
    assert cfg["driver"][0]["foreground_slice_us"] == 100


def test_second_host_rows_change_only_the_second_driver() -> None:
    """rt+app+bg-own-host+* (#15, bgtune21): a row's "second_host" keys go into the second
    [[driver]] entry only, its "options" merged into the first's; the first entry stays
    rt+app+bg-own-host's, and the second keeps every key it does not override."""
    base = contention.npud_config(dict(contention.VARIANTS["rt+app+bg-own-host"]))
    cfg = contention.npud_config(
        dict(contention.VARIANTS["rt+app+bg-own-host+here-normal+bg-normal+2t"]))
    first, second = cfg["driver"]
    assert first == base["driver"][0] and "background_sched" not in first
    assert second == {**base["driver"][1], "background_burst_here": "normal",
                      "background_sched": "normal",
                      "options": {"intra_op_threads_background": 2}}
    merged = contention.npud_config({"options": {"intra_op_threads": 1},
                                     "own_host": ["embedder"],
                                     "second_host": {"options": {"intra_op_spinning": 0}}})
    assert merged["driver"][0]["options"] == {"intra_op_threads": 1}
    assert merged["driver"][1]["options"] == {"intra_op_threads": 1, "intra_op_spinning": 0}
    rows = [n for n in contention.VARIANTS if n.startswith("rt+app+bg-own-host+")]
    assert rows and all(contention.VARIANTS[n]["own_host"] for n in rows)
    assert all(("unmanaged", n) in contention.pairs(["unmanaged", n]) for n in rows)


def test_second_host_rows_are_configs_npud_accepts(tmp_path: Path) -> None:
    """Each row's keys are [[driver]] keys of their own names and values npud takes (the
    same names the product's background host reads), its options the reference driver's."""
    from npumanager.config import file_problems
    from npumanager.drivers.option_specs import option_problems
    from npumanager.testing.daemon import to_toml

    for name in [n for n in contention.VARIANTS
                 if n.startswith(("rt+app+bg-own-host+", "rt+app+bg-host+"))]:
        knobs = dict(contention.VARIANTS[name])
        knobs.pop("camera_realtime")  # (bench keys: the apps' side)
        knobs.pop("embedder_inflight", None)
        contention.second_host.embedder_knobs(knobs)
        cfg = contention.npud_config(knobs)
        path = tmp_path / f"{len(name)}.toml"
        path.write_text(to_toml(cfg))
        assert file_problems(path).problems == [], name
        assert list(option_problems("reference", cfg["driver"][-1]["options"])) == [], name


def test_the_recommended_configs_ablation_rows_each_leave_out_one_part() -> None:
    """#15's ablation of the recommended config: each WITHOUT row is the recommended row
    as that ablation measured it (ABLATED: before load28's background_load_nice)
    less the app's FIFO thread, the host's FIFO thread (and its switch interval), or both;
    each is held against unmanaged, and its npud config is one [[driver]] with the lane."""
    sh = contention.second_host
    full = contention.VARIANTS[sh.ABLATED]
    host_rt = {"foreground_rt_priority", "switch_interval_us"}
    less = {"rt+bg-host+here-normal+step-nice": {"camera_realtime"},
            "app+bg-host+here-normal+step-nice": host_rt,
            "bg-host+here-normal+step-nice": host_rt | {"camera_realtime"}}
    for name, gone in less.items():
        row = contention.VARIANTS[name]
        assert row == {k: v for k, v in full.items() if k not in gone}, name
        assert ("unmanaged", name) in contention.pairs(["unmanaged", name])
        knobs = {k: v for k, v in row.items() if k != "camera_realtime"}
        [entry] = contention.npud_config(knobs)["driver"]
        assert entry["background_host"] is True
        assert entry["background"] == {"background_burst_here": "normal",
                                       "background_step_nice": 19}
        assert ("foreground_rt_priority" in entry) == ("foreground_rt_priority" not in gone)


def test_the_load_nice_row_is_the_tuned_lane_with_the_loads_nice_value() -> None:
    """rt+app+bg-host+here-normal+step-nice+load-nice (load28): the tuned lane's row with
    the lane's background loads at nice 19 (background_load_nice); the recommended row."""
    sh = contention.second_host
    base = contention.VARIANTS[sh.ABLATED]
    row = contention.VARIANTS["rt+app+bg-host+here-normal+step-nice+load-nice"]
    assert sh.RECOMMENDED == "rt+app+bg-host+here-normal+step-nice+load-nice"
    assert row == {**base, "background": {**base["background"], "background_load_nice": 19}}
    knobs = {k: v for k, v in row.items() if k != "camera_realtime"}
    [entry] = contention.npud_config(knobs)["driver"]
    assert entry["background"]["background_load_nice"] == 19


def test_the_default_auto_row_sets_nothing_and_gets_the_recommended_set() -> None:
    """default-auto (auto27): npud's product default, no protection key set, the camera
    and the voice asking for their threads; held against unmanaged (and unmanaged-rt);
    `npu demo --compare` runs these two. Where "auto" resolves
    to on, npud runs what the recommended row sets by hand; every other row runs
    `--protect-foreground off`."""
    from npumanager.config import Config
    from npumanager.demo.contention import compare_runs
    from npumanager.hal.host_config import HostConfig
    from npumanager.service.protection import expand

    assert contention.VARIANTS["default-auto"] == {"protect_foreground": None,
                                                   "camera_realtime": 2, "voice_realtime": 2}
    # (and default-auto+voice-plain: the voice not asking, as before voice29)
    assert contention.VARIANTS["default-auto+voice-plain"] == {"protect_foreground": None,
                                                               "camera_realtime": 2}
    assert not [n for n, k in contention.VARIANTS.items()
                if not n.startswith("default-auto") and "protect_foreground" in k]
    names = ["unmanaged", "managed", "default-auto", "unmanaged-rt"]
    assert contention.pairs(names) == [("unmanaged", "managed"), ("unmanaged", "default-auto"),
                                       ("unmanaged-rt", "default-auto")]
    auto, _ = expand(Config.load(overrides=contention.npud_config({})))
    knobs = dict(contention.VARIANTS[contention.second_host.RECOMMENDED])
    rt = knobs.pop("camera_realtime")
    by_hand = contention.npud_config(knobs)
    by_hand["manager"]["app_rt_priority"] = rt
    recommended = Config.load(overrides=by_hand)
    assert auto.section("manager")["app_rt_priority"] == rt
    assert auto.section("manager")["app_rt_importance"] == 200  # (a VISIBLE voice's too)
    managed, _, kwargs = contention.run_args("default-auto")
    assert managed and kwargs["protect_foreground"] is None
    assert kwargs["app_knobs"] == {"camera": {"realtime": 2}, "voice": {"realtime": 2}}
    # `npu demo --compare` runs the same two: unmanaged as the bench's, managed as
    # default-auto (npud's default protection; the camera and the voice ask for FIFO).
    (u_name, u_managed, _, u_knobs), (m_name, m_managed, _, m_knobs) = compare_runs()
    assert (u_name, u_managed, u_knobs) == ("unmanaged", False,
                                            contention.run_args("unmanaged")[2]["app_knobs"])
    assert (m_name, m_managed, m_knobs) == ("managed", True, kwargs["app_knobs"])
    for lane in ("", "background"):
        assert HostConfig.from_config(auto, "reference", lane) == \
            HostConfig.from_config(recommended, "reference", lane), lane
