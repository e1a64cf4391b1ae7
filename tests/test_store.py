"""The result store persists across instances and keeps artifact paths inside the data directory."""

from kforge.tools.store import ResultStore


def test_results_and_profiles_survive_a_new_instance(tmp_path):
    ResultStore(tmp_path).put_result("k1", "compile_kernel", {"ok": True})
    ResultStore(tmp_path).put_profile("abc123", "k2", "cpu", {"profile_id": "abc123"})
    again = ResultStore(tmp_path)
    assert again.get_result("k1") == {"ok": True} and again.get_result("nope") is None
    assert again.get_profile("abc123") == {"profile_id": "abc123"}
    assert again.latest_profile_for("k2")["profile_id"] == "abc123"
    assert again.list_profiles()[0]["profile_id"] == "abc123"


def test_artifacts_cannot_escape(tmp_path):
    store = ResultStore(tmp_path)
    (store.artifact_dir("p1") / "trace.json").write_text("{}")
    assert store.artifact_path("p1", "trace.json").read_text() == "{}"
    assert store.artifact_names("p1") == ["trace.json"]
    for bad in ("../kforge.db", "..", "/etc/passwd", ".hidden"):
        assert store.artifact_path("p1", bad) is None
    assert store.artifact_path("../p1", "trace.json") is None
