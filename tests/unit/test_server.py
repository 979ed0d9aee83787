"""Webhook signature checks and the metrics exposition (pure parts of reconciler/server/)."""

from __future__ import annotations

import hashlib
import hmac

from reconciler.server import Metrics, pushed_ref, signature_ok

BODY = b'{"ref": "refs/heads/main"}'
SECRET = "s3cret"


def test_github_and_gitea_hmac_and_gitlab_token() -> None:
    digest = hmac.new(SECRET.encode(), BODY, hashlib.sha256).hexdigest()
    assert signature_ok({"X-Hub-Signature-256": "sha256=" + digest}, BODY, SECRET)
    assert signature_ok({"X-Gitea-Signature": digest}, BODY, SECRET)
    assert signature_ok({"X-Gitlab-Token": SECRET}, BODY, SECRET)
    assert not signature_ok({"X-Hub-Signature-256": "sha256=" + digest}, BODY + b" ", SECRET)
    assert not signature_ok({"X-Gitea-Signature": digest.upper()[:-1]}, BODY, SECRET)
    assert not signature_ok({"X-Gitlab-Token": "nope"}, BODY, SECRET)
    assert not signature_ok({}, BODY, SECRET)
    assert signature_ok({"x-hub-signature-256": "sha256=" + digest}, BODY, SECRET)
    assert signature_ok({"X-HUB-SIGNATURE-256": "sha256=" + digest.upper()}, BODY, SECRET)
    assert not signature_ok({"X-Gitlab-Token": "s3cr\u00e9t"}, BODY, "s3cr\u00e9t")  # non-ASCII: refused, no error


def test_pushed_ref() -> None:
    assert pushed_ref(BODY) == "refs/heads/main"
    assert pushed_ref(b"not json") is None
    assert pushed_ref(b"[]") is None


def test_metrics_render() -> None:
    m = Metrics()
    m.tick(0.07)
    m.tick(3.0)
    m.set_objects({("model", "RUNNING"): 2, ("task", "QUEUED"): 1})
    m.error("ray")
    m.last_applied_commit_time = 1764417600.0
    text = m.render()
    assert 'argus_reconcile_duration_seconds_bucket{le="0.1"} 1.0' in text
    assert 'argus_reconcile_duration_seconds_bucket{le="+Inf"} 2.0' in text
    assert "argus_reconcile_duration_seconds_count 2.0" in text
    assert 'argus_objects{kind="model",state="RUNNING"} 2.0' in text
    assert 'argus_objects{kind="task",state="QUEUED"} 1.0' in text
    assert 'argus_errors_total{kind="ray"} 1.0' in text
    assert "argus_last_applied_commit_timestamp_seconds 1.7644176e+09" in text
    m.set_objects({("task", "QUEUED"): 3})
    text = m.render()
    assert 'argus_objects{kind="model"' not in text  # a state that no object has any more disappears
    assert 'argus_objects{kind="task",state="QUEUED"} 3.0' in text


def test_two_metrics_instances_do_not_share_counters() -> None:
    a, b = Metrics(), Metrics()
    a.error("ray")
    assert 'argus_errors_total{kind="ray"}' not in b.render()
