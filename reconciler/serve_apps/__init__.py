"""Code that runs inside Ray Serve (controller and replicas).

Modules here import nothing else from ``reconciler``: the cluster needs only this
package importable (argus installed on the Ray nodes, or on their PYTHONPATH).
"""
