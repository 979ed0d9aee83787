"""argus's OpenAI endpoint: keys, access rules, rate limits and usage, in argus's own processes.

Ray trusts every job as an administrator, so nothing that decides for users lives in Ray: the
endpoint (:mod:`~reconciler.endpoint.server`) checks each request against the daemon's gate
config (:mod:`~reconciler.endpoint.gate`) and its meter (:mod:`~reconciler.endpoint.meter`), then
forwards it to Ray Serve's own proxy without any caller's credential. It runs in the daemon's
process (``argus run``) or as processes of its own (``argus endpoint``) linked to the daemon over a
private socket (:mod:`~reconciler.endpoint.link`); :mod:`~reconciler.endpoint.hub` is the daemon's
side.
"""
