"""Reading the desired state: a git commit's tree or a plain directory; watching for changes. I/O."""
