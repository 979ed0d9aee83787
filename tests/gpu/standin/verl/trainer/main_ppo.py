"""Not verl's: tests/gpu/standin/README.md."""

from verl.trainer.loop import main

if __name__ == "__main__":
    main("ppo")
