"""Write one tick's outcome to git: the status branch and a git note. I/O.

Work is O(changed objects): a document is rebuilt only when its inputs (the object's status,
file, log tails) differ from the last write, serialised (libyaml's C emitter) and hashed
only when it differs from what the branch holds, and the README table is re-assembled from
cached rows. The ref moves by compare-and-swap: a concurrent writer's commit is re-read and
built upon, never overwritten.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from bisect import bisect_left, insort
from collections import deque
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from reconciler import git
from reconciler.errors import ConcurrentWrite, StatusBranchBlocked
from reconciler.plan.actions import ActionType, Plan
from reconciler.plan.assess import ObjectStatus
from reconciler.plan.memory import key_of_path
from reconciler.plan.moved import moved
from reconciler.redact import redact, redact_tree, redact_url
from reconciler.source.remote import RepoSource, tracking_ref
from reconciler.status import blocking
from reconciler.status.branch import TreeWriter, hash_blobs, tip, write_note
from reconciler.status.documents import ReadmeRows, dump, dump_json, object_document, readme, readme_row
from reconciler.status.persistent import evolved
from reconciler.status.store import StatusSnapshot, StatusStore
from reconciler.status.trust import StatusTrust
from reconciler.status.usage import MAX_DOCUMENTS_PER_COMMIT, USAGE_DIR, is_usage_path

log = logging.getLogger("argus")
NOTES_REF = "argus"
ROOT_FILE = "revision.yaml"
ROOT_FILES = frozenset({"README.md", ROOT_FILE, "actual.json"})  # argus's files besides the documents
MAX_ATTEMPTS = 5
MAX_ALERTS = 10  # integrity alerts kept for the README and /healthz (the newest)


def utc_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


@dataclass
class StatusReport:
    """What to write for one tick (built by the daemon from a TickResult).

    ``spec_ids``: path -> the object's file blob (its own spec revision); ``daemon_error``:
    the last tick failed unexpectedly (shown in the README until a tick succeeds)."""

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
    # Object -> when the daemon first saw it (the plan's admission times), published in
    # actual.json beside ``actual`` as its ``first_seen`` (kept apart: a push moves one entry of it).
    first_seen: Mapping[Any, int] | None = None
    spec_ids: Mapping[str, str] = field(default_factory=dict)
    resolved: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # path -> resolved spec
    subject: str = ""
    daemon_error: str | None = None
    # The writer's run-record count (:attr:`StatusWriter.records`) when the tick this report
    # describes ended; None: the report knows every record. A document with a run recorded after
    # that (the next tick's new task, while this report waited for the background writer) is not
    # removed by this report: its run must stay on record until a report that knows it.
    records_seen: int | None = None
    # ``usage/<date>.json`` -> usage document (:mod:`reconciler.status.usage`): only the dates
    # whose rows changed since the last report (the daemon hands them at most once a minute).
    usage: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)


@dataclass(frozen=True)
class _Fed:
    """What a report's documents are made of, beside each object's status: comparing it with the
    last report adopted names the objects whose document may differ (the rest are not looked at)."""

    statuses: Mapping[Any, ObjectStatus]
    spec_ids: Mapping[str, str]
    resolved: Mapping[str, Mapping[str, Any]]
    applied: frozenset[Any]
    failed: frozenset[Any]
    tails: frozenset[str]
    checkpoints: Mapping[str, str | None]

    @classmethod
    def of(cls, report: StatusReport) -> _Fed:
        # Copies (C-speed): a caller may hand the same mapping again, changed in place.
        return cls(
            dict(report.statuses),
            dict(report.spec_ids),
            dict(report.resolved),
            frozenset(report.applied_keys),
            frozenset(report.failed_keys),
            frozenset(report.log_tails),  # the reporter adds tails to its mapping in place
            dict(report.checkpoints),
        )

    def moved_since(self, old: _Fed, with_runs: set[Any]) -> set[Any]:
        """The objects whose document inputs may differ from ``old``'s (a superset: each is
        compared again by its whole signature), present in either. ``with_runs``: the objects
        whose statuses hold runs (a log tail or a checkpoint is an input of theirs only)."""
        keys = moved(self.statuses, old.statuses, same_object=True)
        keys |= self.applied ^ old.applied
        keys |= self.failed ^ old.failed
        paths = moved(self.spec_ids, old.spec_ids) | moved(self.resolved, old.resolved, same_object=True)
        keys.update(k for k in map(key_of_path, paths) if k is not None)
        if self.tails != old.tails or moved(self.checkpoints, old.checkpoints):
            keys |= with_runs
        return keys


class _SeenTable:
    """``actual.json``'s ``first_seen``: when the daemon first saw each object, one entry per
    object (100,000 at the largest scale measured), of which a push changes one or two. Kept as
    one redacted JSON fragment per entry in the order ``json.dumps(sort_keys=True)`` gives, and
    updated only where the table moved; the file's text and its parsed value are assembled from
    them in C (a join and a dict copy)."""

    def __init__(self) -> None:
        self.source: Mapping[Any, Any] = {}
        self._entries: dict[Any, str] = {}  # object -> its redacted key
        self._fragments: dict[str, str] = {}  # redacted key -> '"key": value'
        self._values: dict[str, Any] = {}  # redacted key -> value (the parsed table)
        self._order: list[str] = []  # the redacted keys, sorted
        self._text: str | None = "{}"
        self._collided = False
        self.version = 0  # moves with every change of the table

    def update(self, table: Mapping[Any, Any], redact: Callable[[str], str]) -> bool:
        """Follow ``table`` (object -> epoch seconds; values compared with ``==``). Returns whether
        the table moved. Raises what ``redact`` raises; then the next update rebuilds it whole."""
        changed = moved(table, self.source)
        if not changed:
            return False
        self._text, self.version = None, self.version + 1
        table = dict(table)  # C-speed: the caller's mapping may change in place later
        try:
            if not self._collided and len(changed) <= max(1024, len(self._entries) // 8):
                self._apply(changed, table, redact)
            if self._collided or len(changed) > max(1024, len(self._entries) // 8):
                # Two objects whose names redact alike share one entry, the last in ``table``'s
                # order (as a redaction of the whole table gives): rare, then rebuilt whole.
                self._entries, self._fragments, self._values, self._order = {}, {}, {}, []
                self._collided = False
                self._apply(table.keys(), table, redact)
        except BaseException:
            self.source, self._entries, self._fragments, self._values, self._order = {}, {}, {}, {}, []
            raise
        self.source = table
        return True

    def _apply(self, keys: Iterable[Any], table: Mapping[Any, Any], redact: Callable[[str], str]) -> None:
        fresh: list[str] = []
        for key in keys:
            old = self._entries.pop(key, None)
            if old is not None and old in self._fragments:
                del self._fragments[old], self._values[old]
                del self._order[bisect_left(self._order, old)]
            if key not in table:
                continue
            name, value = next(iter(redact_tree({str(key): table[key]}, redact).items()))
            self._entries[key] = name
            if name in self._fragments:
                self._collided = True
            else:
                fresh.append(name)
            self._fragments[name] = f"{json.dumps(name)}: {json.dumps(value, sort_keys=True, default=str)}"
            self._values[name] = value
        if len(fresh) > 64:
            self._order = sorted(self._fragments)
        else:
            for name in fresh:
                insort(self._order, name)

    def text(self) -> str:
        """The table as ``json.dumps(..., sort_keys=True)`` writes it."""
        if self._text is None:
            self._text = "{" + ", ".join(map(self._fragments.__getitem__, self._order)) + "}"
        return self._text

    def value(self) -> dict[str, Any]:
        """The table as a reader parses it, in another order (a new dict: snapshots hold it)."""
        return dict(self._values)


def _path(key: Any) -> str:
    return str(key.path)


def default_redaction(text: str) -> str:
    """The default: credential patterns, URL credentials and control sequences (the daemon passes
    a Redactor that also knows the values of its own secrets)."""
    return redact(text)


@dataclass
class StatusWriter:
    """Writes the status branch (and notes) of ``source``; pushes when it is a remote.

    Redaction has one choke point, :meth:`_safe`: every value that becomes a blob (object
    documents, ``revision.yaml``, ``actual.json``) passes through it before it is cached or
    serialised, the README is assembled from rows of those documents and from redacted
    messages, and commit messages and notes pass through ``redact`` as whole texts.

    ``auth_key`` (:func:`reconciler.status.auth.status_key`; the daemon sets it) authenticates
    every commit and note written, and only commits that verify are read back
    (:class:`~reconciler.status.trust.StatusTrust`, anchored in ``anchor_file`` in the state
    folder); a tip that does not is ignored, reported in ``alerts``, and replaced by the next
    write. Without a key the branch is written and read as it is (tests, old set-ups)."""

    source: RepoSource
    branch: str = "argus/status"
    endpoint: str = "http://127.0.0.1:8000/v1"
    now: Callable[[], str] = utc_now
    redact: Callable[[str], str] = default_redaction
    commits: int = 0
    files_changed: int = 0  # files the last commit changed (for benchmarks and tests)
    # The commit this writer builds on (``_tip``): its files are in the store (:meth:`_view`; the
    # one cache of them); what the writer derives from them is here: README rows and the inputs
    # each document was built from.
    _tip: str | None = None
    _rows: ReadmeRows = field(default_factory=ReadmeRows)
    _inputs: dict[str, tuple[Any, ...]] = field(default_factory=dict)
    # What the last report adopted was made of (None: the next write looks at every object), the
    # objects whose document must be looked at again whatever moved (recorded runs, a failed
    # build), and the objects with runs (a log tail or checkpoint arriving concerns only them).
    _fed: _Fed | None = None
    _unfed: set[Any] = field(default_factory=set)
    _with_runs: set[Any] = field(default_factory=set)
    _store_: StatusStore | None = None
    _last_actual: Mapping[str, Any] | None = None
    _written: dict[str, bytes] = field(default_factory=dict)  # README.md / revision.yaml as last written
    # actual.json's list entries as last redacted (their JSON -> the redacted entry): only entries
    # that changed are redacted again. Holds the last write's entries only.
    _actual_entries: dict[Any, Any] = field(default_factory=dict)
    # actual.json's first_seen (StatusReport.first_seen), and its version last adopted.
    _seen: _SeenTable = field(default_factory=lambda: _SeenTable())
    _seen_written: int = -1
    _lock: threading.RLock = field(default_factory=threading.RLock)
    # Runs recorded so far, and path -> the count when its last run was recorded: only the
    # records no adopted report knows yet (a handful: dropped as reports catch up).
    records: int = 0
    _recorded: dict[str, int] = field(default_factory=dict)
    _tree_writer: TreeWriter | None = None
    auth_key: bytes | None = None
    anchor_file: str | None = None
    alerts: deque[str] = field(default_factory=lambda: deque(maxlen=MAX_ALERTS))
    _trust: StatusTrust | None = None
    _refs_seen: tuple[str | None, str | None] | None = None  # (local, published) last resolved
    _expected: str | None = None  # where the local ref is (the CAS value of the next commit)
    # Why the status branch cannot be created here, or published to the remote: a ref that blocks
    # it (:mod:`reconciler.status.blocking`), found each time the refs are read; None when none
    # does. Shown on /healthz. ``_blocked_here``: the block is in the repository argus writes (then
    # nothing is recorded, :class:`~reconciler.errors.StatusBranchBlocked`), not only on the remote.
    blocked: str | None = None
    _blocked_here: bool = False

    def __post_init__(self) -> None:
        self.source.status_branch = self.branch  # mirrored from the remote never (remote.py)

    @property
    def _store(self) -> StatusStore:
        if self._store_ is None or self._store_.repo != self.source.repo.path:
            self._store_ = StatusStore(self.source.repo.path, self.branch)
        return self._store_

    def _view(self) -> StatusSnapshot:
        """The files of ``_tip`` (call under the lock): the store holds them, so this reads
        nothing unless the store was handed another commit since."""
        return self._store.read(self._tip) if self._tip else StatusSnapshot(tip=None)

    @property
    def _trees(self) -> TreeWriter:
        if self._tree_writer is None or self._tree_writer.repo != self.source.repo.path:
            self._tree_writer = TreeWriter(self.source.repo.path, self.auth_key)
        self._tree_writer.auth_key = self.auth_key
        return self._tree_writer

    def alert(self, message: str) -> None:
        """Report an integrity problem (a forged record ignored): logged once, kept for the
        status README and /healthz (the newest :data:`MAX_ALERTS`)."""
        text = f"{self.now()} {self.redact(message)}"
        if any(a.partition(" ")[2] == text.partition(" ")[2] for a in self.alerts):
            return
        log.warning("status integrity: %s", text)
        self.alerts.append(text)

    def write(self, report: StatusReport) -> str | None:
        """Commit the status tree if anything changed; note the desired commit. Returns the
        new status commit (None when nothing changed). A lost race (the ref moved, the push
        was rejected) re-reads the branch and builds on the other side's commit."""
        for _attempt in range(MAX_ATTEMPTS):
            try:
                commit = self._commit(report)
            except ConcurrentWrite as exc:
                # Recorded runs (this writer's other thread) or another writer moved the ref:
                # the next attempt starts from the new tip (re-read when it is not ours).
                log.info("status branch moved under us (%s); retrying on the new tip", exc)
                continue
            except StatusBranchBlocked:
                return None  # logged and shown on /healthz from when it began (_set_blocked)
            noted = self._note(report)
            if self.blocked is not None:
                return commit  # written here; the remote cannot take it until its blocking ref is gone
            republish = self._unpublished()
            if commit is None and not noted and not republish:
                return None
            refs = [f"refs/heads/{self.branch}"] if commit or republish else []
            refs += [f"refs/notes/{NOTES_REF}"] if noted else []
            if self.source.push(refs):
                if commit:
                    self.commits += 1
                return commit
            log.info("status push rejected; fetching and retrying")
            self.source.fetch()
        log.warning("status write kept losing races; will retry next tick")
        return None

    def _unpublished(self) -> bool:
        """True when the remote's status branch is not the one argus holds (forged, rewound,
        deleted): the next push replaces it."""
        with self._lock:
            if self.source.local or self.auth_key is None or self._expected is None:
                return False
            return self._refs()[1] != self._expected

    def documents(self) -> Mapping[str, Mapping[str, Any]]:
        """The status documents of the commit argus builds on (re-read only when its tip moved;
        from the store, :mod:`reconciler.status.store`). Raises GitError when git cannot read them.

        The run records in them are what the planner treats as runs (never resubmitted)."""
        with self._lock:
            self._refresh()
            return self._view().docs

    def usage_documents(self) -> dict[str, Any]:
        """The usage documents (``usage/<date>.json`` -> parsed JSON) of the commit argus builds
        on: what a restarted daemon continues from. Raises GitError when git cannot read them."""
        with self._lock:
            self._refresh()
            tip = self._tip
        if tip is None:
            return {}
        return {p: v for p, v in self._store.files_under(USAGE_DIR, tip).items() if is_usage_path(p)}

    def record_runs(self, runs: list[tuple[Any, str, str]]) -> bool:
        """Record ``(task key, submission id, spec hash)`` runs as SUBMITTED on the branch, and
        push, before they are submitted: a run is on record before it can exist in Ray, so a
        kill at any later point (and a Ray head restart) can never make it run twice.

        Returns False when the record could not be made durable (then nothing is submitted).
        Raises StatusBranchBlocked when the branch cannot be created here (:attr:`blocked`); with
        no ``runs`` it only checks that (a preemption is applied only when its record can follow).
        A branch that the remote alone cannot take is recorded here (the mirror argus writes and
        reads back), as after any failed push, and published once the remote can take it."""
        for _attempt in range(MAX_ATTEMPTS):
            with self._lock:
                parent = self._refresh()
                if self._blocked_here:
                    raise StatusBranchBlocked(self.blocked or self.branch)
                if not runs:
                    return True
                expected = self._expected
                view = self._view()  # never changed: read without a copy
                # Before the ref can move: a report written meanwhile must already see the record.
                self.records += 1
                self._recorded.update((key.path, self.records) for key, _sid, _hash in runs)
            docs: dict[str, Mapping[str, Any]] = {}
            # When argus submitted the run, by its own clock: the earliest a run's GPU-seconds count
            # from, whatever Ray's record (which job code can rewrite) says (reconciler/observe/sightings.py).
            submitted = self.now()
            for key, sid, spec_hash in runs:
                fresh = {"object": str(key), "kind": "Task", "state": "SUBMITTED"}
                doc = dict(docs.get(key.path) or view.docs.get(key.path) or fresh)
                old = doc.get("runs")
                recorded = [r for r in (old if isinstance(old, list) else []) if isinstance(r, dict)]
                recorded = [r for r in recorded if r.get("submission_id") != sid]
                entry = {"submission_id": sid, "spec_hash": spec_hash, "status": "SUBMITTED", "submitted_at": submitted}
                doc["runs"] = [*recorded, entry]
                docs[key.path] = doc
            docs = {path: self._safe(dict(unsafe)) for path, unsafe in docs.items()}
            changed = {path: dump(doc) for path, doc in docs.items()}
            blobs = evolved(view.blobs, hash_blobs(self.source.repo.path, changed))
            message = self.redact("argus: submitting " + ", ".join(sid for _key, sid, _hash in runs) + "\n")
            try:
                commit = self._trees.commit(self.branch, blobs, message, parent, view.blobs, expected, changed=changed)
            except ConcurrentWrite:
                continue  # the ref moved under us (compare-and-swap): re-read and retry
            if commit is not None:
                with self._lock:
                    self._committed(commit)
            if commit is None or self.blocked is not None or self.source.push([f"refs/heads/{self.branch}"]):
                if commit is not None:
                    with self._lock:
                        if self._tip == parent:
                            self._store.adopt(commit, blobs, docs, parent=parent, paths=changed)
                            self._tip = commit
                            self._unfed.update(key for key, _sid, _hash in runs)
                            for path, recorded_doc in docs.items():  # rebuilt from the record next write
                                self._inputs.pop(path, None)
                                self._rows.update({path: readme_row(path, recorded_doc)})
                        self.commits += 1
                return True
            self.source.fetch()
        log.warning("could not record runs on the status branch; not submitting them this tick")
        return False

    def _refresh(self) -> str | None:
        """Re-read the branch when its tip is not the one this writer knows (call under the
        lock). Returns the commit to build on (the trusted one); ``_expected`` is where the
        local ref is."""
        repo = self.source.repo.path
        if self.auth_key is None:
            self._refs()  # for the refs that may block the branch
            parent = tip(repo, self.branch)
            self._expected = parent
            if parent != self._tip:  # first use, or someone else moved the branch: re-read it
                self._reload(parent)
            return parent
        local, published = self._refs()
        if (local, published) == self._refs_seen:
            return self._tip
        if self._trust is None:
            self._trust = StatusTrust(self.auth_key, self.anchor_file)
        resolution = self._trust.resolve(repo, [published, local] if published != local else [local])
        for message in resolution.alerts:
            self.alert(message)
        base = resolution.base
        if not self.source.local and base is not None and published is None and local is not None:
            self.alert(f"the status branch is missing on the remote: {base[:12]} is published again")
        if base is not None and base == published and local != published:
            # Another daemon with this key wrote on: the local ref follows (compare-and-swap).
            moved = git.probe(repo, "update-ref", f"refs/heads/{self.branch}", base, local or "0" * 40)
            if moved.returncode == 0:
                local = base
        self._expected = local
        if base != self._tip:
            self._reload(base)
        self._refs_seen = (local, published)
        return base

    def _refs(self) -> tuple[str | None, str | None]:
        """(the local status ref, the remote's copy of it: None for a local repository). The same
        listing names the refs that block the branch here or on the remote (:attr:`blocked`)."""
        own = f"refs/heads/{self.branch}"
        remote = tracking_ref(own).removesuffix(self.branch)  # where the remote's branches are fetched to
        patterns = blocking.patterns(self.branch)
        if not self.source.local:
            patterns += blocking.patterns(self.branch, remote)
        listing = git.text(self.source.repo.path, "for-each-ref", "--format=%(objectname) %(refname)", *patterns)
        found: dict[str, str] = {}
        for line in listing.splitlines():
            sha, _, ref = line.partition(" ")
            found[ref] = sha
        where = "the repository" if self.source.local else f"the remote {redact_url(self.source.url)}"
        self._set_blocked(*blocking.blocked(found, self.branch, where, None if self.source.local else remote))
        return found.get(own), (None if self.source.local else found.get(tracking_ref(own)))

    def _set_blocked(self, message: str | None, here: bool) -> None:
        """Record what blocks the branch (None: nothing); logged when it begins, changes or ends."""
        if message is not None:
            message = self.redact(message)
        if message != self.blocked:
            if message is not None:
                log.error(json.dumps({"event": "status_branch_blocked", "error": message}))
            else:
                log.info(json.dumps({"event": "status_branch_unblocked", "branch": self.branch}))
        self.blocked, self._blocked_here = message, here

    def _committed(self, commit: str) -> None:
        """``commit`` is argus's and the local ref is at it (call under the lock)."""
        self._expected = commit
        if self.auth_key is not None:
            if self._trust is None:
                self._trust = StatusTrust(self.auth_key, self.anchor_file)
            self._trust.remember(commit)
        # Resolved again on the next read: cheap (the commit is the anchor), and it picks up the
        # cache this writer's other thread may not have updated.
        self._refs_seen = None

    def _reload(self, parent: str | None) -> None:
        """Build on ``parent``: the store reads what the branch holds there (what changed since
        the commit it read last), and what the writer derives from it is rebuilt."""
        docs = self._store.read(parent).docs if parent else {}
        self._rows = ReadmeRows({path: readme_row(path, doc) for path, doc in docs.items()})
        self._inputs, self._fed, self._unfed, self._with_runs = {}, None, set(), set()
        # What this writer last wrote is not what ``parent`` holds (another writer's commit):
        # the root files are compared with the branch again, never with our own last write.
        self._written, self._last_actual = {}, None
        self._tip = parent

    def _commit(self, report: StatusReport) -> str | None:
        repo = self.source.repo.path
        with self._lock:  # a consistent view of the cache; built and committed outside the lock
            parent = self._refresh()
            if self._blocked_here:
                raise StatusBranchBlocked(self.blocked or self.branch)
            expected = self._expected
            alerts = list(self.alerts)
            view = self._view()  # a snapshot is never changed: read without a copy
            previous, known_blobs = view.docs, view.blobs
            known_root = view.root.get(ROOT_FILE)
            # Copies (C-speed): record_runs, on the other thread, edits these under the lock.
            inputs, rows, known_written = dict(self._inputs), self._rows.copy(), dict(self._written)
            last_actual, seen_written = self._last_actual, self._seen_written
            fed, unfed, with_runs = self._fed, set(self._unfed), set(self._with_runs)
            seen = self.records if report.records_seen is None else report.records_seen
            unknown = {p for p, n in self._recorded.items() if n > seen}
        built: dict[str, dict[str, Any]] = {}  # the documents that differ from the branch's
        transitions: list[str] = []
        now = self.now()
        # Source unreadable or tick failed (no revision): every object's document is kept.
        statuses = {} if report.revision is None else report.statuses
        log_tails, checkpoints = report.log_tails, report.checkpoints
        fed_now = None if report.revision is None else _Fed.of(report)
        visit: Collection[Any]
        removed: list[str] = []
        if fed is not None and fed_now is not None:
            visit = fed_now.moved_since(fed, with_runs) | unfed
        else:  # every object: the first write, or on a commit this writer did not build
            visit = statuses.keys()
            with_runs = set()
            present = set(map(_path, statuses))
            if report.revision is not None:
                removed = sorted(previous.keys() - present - unknown)
        # Looked at again next write: a failed build, or a document kept for a run this report
        # does not know of.
        failed: set[Any] = {k for k in map(key_of_path, unknown & previous.keys()) if k is not None}
        for key in visit:
            path = key.path
            st = statuses.get(key)
            if st is None:  # gone since the last write
                with_runs.discard(key)
                if path in previous and path not in unknown:
                    removed.append(path)
                continue
            if st.runs:
                with_runs.add(key)
            else:
                with_runs.discard(key)
            prev = previous.get(path)
            applied = (
                key not in report.failed_keys
                and st.sync in ("Synced", "OutOfSync")
                and (st.sync == "Synced" or key in report.applied_keys)
            )
            spec_id = report.spec_ids.get(path)
            resolved = report.resolved.get(path)
            if st.runs:
                tails = tuple(j.submission_id in log_tails for j in st.runs)
                ran = tuple(checkpoints.get(j.submission_id) for j in st.runs)
            else:
                tails = ran = ()
            # The revision is not an input: an object's document moves only with its own file.
            # The resolved spec is memoised per file and cluster.yaml: the same object while unchanged.
            # Statuses are values handed on while unchanged, so the comparison is mostly by identity.
            signature = (st, applied, spec_id, tails, ran, id(resolved))
            if prev is not None and inputs.get(path) == signature:
                continue  # nothing about this object changed
            try:
                doc = self._safe(
                    object_document(
                        st,
                        prev,
                        revision=report.revision,
                        applied=applied,
                        now=now,
                        endpoint=self.endpoint,
                        log_tails=log_tails,
                        checkpoints=checkpoints,
                        spec_id=spec_id,
                        redact=self.redact,
                        spec=resolved,
                    )
                )
            except Exception as exc:  # one object's document must not stop the others'
                log.error("status document of %s failed", key, exc_info=exc)
                inputs.pop(path, None)  # the last document stays (a new object has none yet)
                failed.add(key)
                continue
            inputs[path] = signature
            if prev is None or (prev.get("state"), prev.get("sync")) != (doc["state"], doc["sync"]):
                before = f"{prev.get('state')}/{prev.get('sync')}" if prev else "new"
                transitions.append(f"{key}: {before} -> {doc['state']}/{doc['sync']}")
            if prev != doc or path not in known_blobs:
                built[path] = doc
        removed.sort()
        for path in removed:
            transitions.append(f"{path.removeprefix('users/').removesuffix('.yaml')}: removed")
            inputs.pop(path, None)
            rows.discard(path)
        # Files that are neither an object's document nor argus's own (a branch argus did not
        # write) are dropped.
        # A commit this writer built holds no stray (each is dropped when first seen).
        strays = (
            []
            if fed is not None
            else [
                p
                for p in known_blobs.keys() - previous.keys()
                if p not in ROOT_FILES and not is_usage_path(p)  # usage documents are argus's too
            ]
        )
        changed: dict[str, bytes] = {}
        for path, doc in built.items():
            try:
                changed[path] = dump(doc)
            except Exception as exc:
                log.error("status document %s cannot be written", path, exc_info=exc)
                inputs.pop(path, None)
                failed.update(k for k in (key_of_path(path),) if k is not None)
        written_docs = {path: built[path] for path in changed}
        rows.update({path: readme_row(path, doc) for path, doc in written_docs.items()})
        usage_docs: dict[str, dict[str, Any]] = {}
        handed = sorted(report.usage.items(), reverse=True)  # the newest dates first
        if len(handed) > MAX_DOCUMENTS_PER_COMMIT:
            # The ledger hands at most this many (the rest wait for its next call): more is a bug
            # upstream, and one commit still never carries more.
            left = [p for p, _v in handed[MAX_DOCUMENTS_PER_COMMIT:]]
            log.error(json.dumps({"event": "usage_documents_over_bound", "left_out": left[:20], "count": len(left)}))
            handed = handed[:MAX_DOCUMENTS_PER_COMMIT]
        for path, value in handed:
            if not is_usage_path(path):
                log.error("not a usage document path: %r", path)
                continue
            usage_docs[path] = self._safe(dict(value))
            changed[path] = dump_json(usage_docs[path])
        root = self._root_document(report, known_root if isinstance(known_root, dict) else {})
        errors = [self.redact(e) for e in report.errors]
        if report.source_error:
            errors.insert(0, f"source unavailable: {self.redact(report.source_error)}")
        changed["README.md"] = readme(
            rows,
            revision=root.get("revision", {}).get("last_attempted"),
            # Integrity alerts first: the README lists the first README_MESSAGES of these.
            errors=[f"integrity: {a}" for a in alerts] + errors + [self.redact(n) for n in report.notes],
            last_applied=root.get("revision", {}).get("last_applied"),
            daemon_error=root.get("daemon_error"),
        )
        changed[ROOT_FILE] = dump(root)
        actual = report.actual if report.actual is not None else None
        actual_entries: dict[Any, Any] | None = None
        safe_actual: dict[str, Any] = {}
        if actual is not None:  # a report without a table publishes none
            self._seen.update(report.first_seen or {}, self.redact)
        seen_version = self._seen.version
        if actual is not None and (
            actual != last_actual or seen_version != seen_written or "actual.json" not in known_blobs
        ):
            safe_actual, actual_entries = self._safe_actual(actual)
            raw = {"first_seen": self._seen.text()} if self._seen.source else {}
            changed["actual.json"] = dump_json(safe_actual, raw=raw)
            if raw:
                safe_actual["first_seen"] = self._seen.value()
        written = {p: changed[p] for p in ("README.md", ROOT_FILE)}
        for path in written:  # rebuilt every write (cheap): hashed only when they differ
            if known_written.get(path) == changed[path] and path in known_blobs:
                del changed[path]
        # The commit differs from its parent only at ``touched``: the tree and the store are
        # updated there alone (O(changed), not O(objects)).
        touched = list(dict.fromkeys([*changed, *removed, *strays]))
        blobs = evolved(known_blobs, hash_blobs(repo, changed), (*removed, *strays))
        subject = f"argus: {len(transitions)} transition(s) at {(report.revision or 'unknown')[:12]}"
        message = self.redact(subject + ("\n\n" + "\n".join(transitions) if transitions else "") + "\n")
        commit = self._trees.commit(self.branch, blobs, message, parent, known_blobs, expected, changed=touched)
        self.files_changed = sum(1 for p in touched if blobs.get(p) != known_blobs.get(p))
        with self._lock:
            if commit is not None:
                self._committed(commit)
            if (commit is not None or parent is not None) and self._tip == parent:
                self._tip = now_at = commit or parent
                values: dict[str, Any] = {**written_docs, **usage_docs, ROOT_FILE: root}
                if "README.md" in changed:
                    values["README.md"] = changed["README.md"].decode("utf-8", errors="replace")
                if actual_entries is not None:
                    values["actual.json"] = safe_actual
                self._store.adopt(str(now_at), blobs, values, parent=parent, paths=touched)
                self._rows, self._inputs = rows, inputs
                if fed_now is not None:
                    self._fed, self._with_runs = fed_now, with_runs
                    self._unfed = (self._unfed - unfed) | failed
                    self._recorded = {p: n for p, n in self._recorded.items() if n > seen}
                self._written = written
                if actual is not None:
                    self._last_actual, self._seen_written = actual, seen_version
                if actual_entries is not None:
                    self._actual_entries = actual_entries
        return commit

    def _safe(self, value: dict[str, Any]) -> dict[str, Any]:
        """``value`` with every string and key redacted, and the values of keys that name a
        secret hidden (:func:`reconciler.redact.redact_tree`): the one way into a blob."""
        safe: dict[str, Any] = redact_tree(value, self.redact)
        return safe

    def _safe_actual(self, actual: Mapping[str, Any]) -> tuple[dict[str, Any], dict[Any, Any]]:
        """``actual`` through :meth:`_safe`, list entry by list entry, re-using the entries redacted
        by the last write that are unchanged (a tick changes few jobs; the file holds them all).
        Returns (the redacted state, the entry cache for the next write)."""
        with self._lock:
            known = self._actual_entries
        entries: dict[Any, Any] = {}
        out: dict[str, Any] = {}

        def cached(raw: Any, entry: Any) -> Any:
            safe = entries.get(raw)
            if safe is None:
                safe = known[raw] if raw in known else redact_tree(entry, self.redact)
                entries[raw] = safe
            return safe

        for name, value in actual.items():
            if isinstance(value, list):
                out[self.redact(str(name))] = [cached(json.dumps(e, sort_keys=True, default=str), e) for e in value]
            else:
                out[self.redact(str(name))] = redact_tree(value, self.redact)
        return out, entries

    def _root_document(self, report: StatusReport, known: Mapping[str, Any]) -> dict[str, Any]:
        """``revision.yaml``: the desired revision last attempted and last applied without a
        failure, for the whole repository (object documents do not carry it), from ``known``
        (the file as the branch holds it)."""
        root = {k: v for k, v in known.items() if k != "daemon_error"}
        revisions = dict(root.get("revision") or {})
        if report.revision:
            revisions["last_attempted"] = report.revision
            if not report.failed_keys:
                revisions["last_applied"] = report.revision
            root["subject"] = self.redact(report.subject)
        root["revision"] = revisions
        # Each team's quota use once the tick's plan is applied (the page's per-team view).
        if report.plan is not None and report.plan.teams:
            root["teams"] = report.plan.teams
        elif report.plan is not None:
            root.pop("teams", None)
        if report.source_error:
            root["source_error"] = self.redact(report.source_error)
        else:
            root.pop("source_error", None)
        if report.daemon_error:
            root["daemon_error"] = self.redact(report.daemon_error)
        return self._safe(root)

    def _note(self, report: StatusReport) -> bool:
        if not report.revision:
            return False
        lines = [f"argus: processed {report.revision[:12]}"]
        if report.errors:
            lines += ["", "Validation errors (these objects were not changed):"] + [f"  {e}" for e in report.errors]
        if report.plan is not None:
            plan = report.plan
            # The changes (indexed: at scale a few among many KEEPs), and the deletions the guard held.
            held = plan.deletions_held
            shown = [a for a in plan.actions if a.type is not ActionType.KEEP or a.held] if held else plan.changes
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
        text = self.redact("\n".join(lines) + "\n")
        return write_note(
            self.source.repo.path, report.revision, text, NOTES_REF, replace=acted, auth_key=self.auth_key
        )
