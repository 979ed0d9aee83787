"""Write one tick's outcome to git, once per reconcile: the status branch and a git note. I/O."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from reconciler.errors import SourceUnavailable
from reconciler.plan.actions import ActionType, Plan
from reconciler.plan.assess import ObjectStatus
from reconciler.source.remote import RepoSource
from reconciler.status.branch import commit_tree, hash_blobs, read_documents, tip, tree_blobs, write_note
from reconciler.status.documents import dump, object_document, readme

log = logging.getLogger("argus")
NOTES_REF = "argus"


def utc_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


@dataclass
class StatusReport:
    """What to write for one tick (built by the daemon from a TickResult)."""

    revision: str | None
    statuses: Mapping[Any, ObjectStatus]
    applied_keys: set[Any]
    failed_keys: set[Any]
    plan: Plan | None
    errors: list[str]
    notes: list[str] = field(default_factory=list)
    log_tails: Mapping[str, list[str]] = field(default_factory=dict)
    checkpoints: Mapping[str, str | None] = field(default_factory=dict)
    source_error: str | None = None
    actual: Mapping[str, Any] | None = None  # ActualState.to_json(), published for `argus plan --actual`


@dataclass
class StatusWriter:
    """Writes the status branch (and notes) of ``source``; pushes when it is a remote."""

    source: RepoSource
    branch: str = "argus/status"
    endpoint: str = "http://127.0.0.1:8000/v1"
    now: Callable[[], str] = utc_now
    commits: int = 0
    # What this writer knows the branch holds (valid while the tip is ``_tip``): documents
    # and blob ids, so a tick re-serialises and re-hashes only the objects that changed.
    _tip: str | None = None
    _docs: dict[str, dict[str, Any]] = field(default_factory=dict)
    _blobs: dict[str, str] = field(default_factory=dict)

    def write(self, report: StatusReport) -> str | None:
        """Commit the status tree if anything changed; note the desired commit. Returns the
        new status commit (None when nothing changed). Retries a rejected push after a fetch."""
        for _attempt in range(4):
            commit = self._commit(report)
            noted = self._note(report)
            if commit is None and not noted:
                return None
            refs = ([f"refs/heads/{self.branch}"] if commit else []) + ([f"refs/notes/{NOTES_REF}"] if noted else [])
            if self.source.push(refs):
                if commit:
                    self.commits += 1
                return commit
            log.info("status push rejected; fetching and retrying")
            self.source.fetch()
        log.warning("status push kept failing; will retry next tick")
        return None

    def documents(self) -> dict[str, dict[str, Any]]:
        """The status documents the branch holds now (re-read only when its tip moved).

        The run records in them are what the planner treats as runs (never resubmitted)."""
        self._refresh()
        return self._docs

    def record_runs(self, runs: list[tuple[Any, str, str]]) -> bool:
        """Record ``(task key, submission id, spec hash)`` runs as SUBMITTED on the branch, and
        push, before they are submitted: a run is on record before it can exist in Ray, so a
        kill at any later point (and a Ray head restart) can never make it run twice.

        Returns False when the record could not be made durable (then nothing is submitted)."""
        for _attempt in range(4):
            parent = self._refresh()
            docs = dict(self._docs)
            for key, sid, spec_hash in runs:
                doc = dict(docs.get(key.path) or {"object": str(key), "kind": "Task", "state": "SUBMITTED"})
                old = doc.get("runs")
                recorded = [r for r in (old if isinstance(old, list) else []) if isinstance(r, dict)]
                recorded = [r for r in recorded if r.get("submission_id") != sid]
                doc["runs"] = [*recorded, {"submission_id": sid, "spec_hash": spec_hash, "status": "SUBMITTED"}]
                docs[key.path] = doc
            changed = {key.path: dump(docs[key.path]) for key, _sid, _hash in runs}
            blobs = {**self._blobs, **hash_blobs(self.source.repo.path, changed)}
            message = "argus: submitting " + ", ".join(sid for _key, sid, _hash in runs) + "\n"
            try:
                commit = commit_tree(self.source.repo.path, self.branch, blobs, message, parent)
            except SourceUnavailable:
                continue  # the ref moved under us (compare-and-swap): re-read and retry
            if commit is None or self.source.push([f"refs/heads/{self.branch}"]):
                if commit is not None:
                    self._tip, self._docs, self._blobs = commit, docs, blobs
                    self.commits += 1
                return True
            self.source.fetch()
        log.warning("could not record runs on the status branch; not submitting them this tick")
        return False

    def _refresh(self) -> str | None:
        """Re-read the branch when its tip is not the one this writer knows. Returns the tip."""
        repo = self.source.repo.path
        parent = tip(repo, self.branch)
        if parent != self._tip:  # first use, or someone else moved the branch: re-read it
            self._docs = read_documents(repo, self.branch) if parent else {}
            self._blobs = tree_blobs(repo, parent) if parent else {}
            self._tip = parent
        return parent

    def _commit(self, report: StatusReport) -> str | None:
        repo = self.source.repo.path
        parent = self._refresh()
        previous = self._docs
        docs: dict[str, dict[str, Any]] = {}
        transitions: list[str] = []
        now = self.now()
        for key, st in report.statuses.items():
            prev = previous.get(key.path)
            applied = (
                key not in report.failed_keys
                and st.sync in ("Synced", "OutOfSync")
                and (st.sync == "Synced" or key in report.applied_keys)
            )
            doc = object_document(
                st,
                prev,
                revision=report.revision,
                applied=applied,
                now=now,
                endpoint=self.endpoint,
                log_tails=report.log_tails,
                checkpoints=report.checkpoints,
            )
            if prev is None or (prev.get("state"), prev.get("sync")) != (doc["state"], doc["sync"]):
                before = f"{prev.get('state')}/{prev.get('sync')}" if prev else "new"
                transitions.append(f"{key}: {before} -> {doc['state']}/{doc['sync']}")
            docs[key.path] = doc
        if report.source_error:
            docs = previous  # the source is unreadable: say so, but keep every object's status
        for path in sorted(set(previous) - set(docs)):
            transitions.append(f"{path.removeprefix('users/').removesuffix('.yaml')}: removed")
        errors = list(report.errors)
        if report.source_error:
            errors.insert(0, f"source unavailable: {report.source_error}")
        changed = {
            path: dump(doc) for path, doc in docs.items() if previous.get(path) != doc or path not in self._blobs
        }
        changed["README.md"] = readme(docs, revision=report.revision, errors=errors + report.notes)
        if report.actual is not None:
            changed["actual.json"] = (json.dumps(report.actual, indent=1, sort_keys=True) + "\n").encode()
        blobs = {path: self._blobs[path] for path in docs if path not in changed}
        if report.actual is None and "actual.json" in self._blobs:
            blobs["actual.json"] = self._blobs["actual.json"]  # source unavailable: keep the last one
        blobs.update(hash_blobs(repo, changed))
        subject = f"argus: {len(transitions)} transition(s) at {(report.revision or 'unknown')[:12]}"
        message = subject + ("\n\n" + "\n".join(transitions) if transitions else "") + "\n"
        commit = commit_tree(repo, self.branch, blobs, message, parent)
        if commit is not None:
            self._tip, self._docs, self._blobs = commit, docs, blobs
        return commit

    def _note(self, report: StatusReport) -> bool:
        if not report.revision:
            return False
        lines = [f"argus: processed {report.revision[:12]}"]
        if report.errors:
            lines += ["", "Validation errors (these objects were not changed):"] + [f"  {e}" for e in report.errors]
        if report.plan is not None:
            shown = [a for a in report.plan.actions if a.type is not ActionType.KEEP or "guard" in a.reason]
            if shown:
                lines += ["", "Actions:"] + [f"  {a.type.value} {a.key}: {a.reason}" for a in shown]
        extra = [n for n in report.notes if report.plan is None or n not in report.plan.notes]
        if report.plan is not None:
            extra = list(report.plan.notes) + extra
        if extra:
            lines += ["", "Notes:"] + [f"  {n}" for n in extra]
        # The first tick on a commit writes its note; later ticks replace it only when they
        # act (a queued model finally deploying), so "in sync" never hides what the push did.
        acted = report.plan is not None and report.plan.has_changes
        text = "\n".join(lines) + "\n"
        return write_note(self.source.repo.path, report.revision, text, NOTES_REF, replace=acted)
