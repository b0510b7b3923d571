"""The one way every command takes its configuration: ``--config FILE``, ``--set KEY=VALUE``
(repeatable) and, where a packaged preset exists, ``--quick``; ``--help`` lists the keys."""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable

from plasticlm.env import DEVICE_ENV, DEVICES, DTYPE_ENV, DTYPE_NAMES


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the key list's layout, and builds it only when help is shown (a callable
    epilog), so that plain commands do not import every method to start."""

    def add_text(self, text):
        super().add_text(text() if callable(text) else text)


def non_empty(text: str) -> str:
    """An argparse type: an empty value (``--config ""``) is a mistake, not "none"."""
    if not text.strip():
        raise argparse.ArgumentTypeError("empty value")
    return text


def int_in(low: int, high: int) -> Callable[[str], int]:
    """An argparse type: an integer in [low, high] (a size, count or seed that torch, NumPy
    and the machine can hold), refused by the parser otherwise."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{value} is not in [{low}, {high}]")
        return value
    parse.__name__ = "int"
    return parse


SEED = int_in(0, 2**32 - 1)      # torch and NumPy take seeds in [0, 2**32)
SIZE = int_in(1, 2**20)          # a count, width or length one machine can hold
THREADS = int_in(1, 4096)


def config_keys(*targets: str) -> Callable[[], str]:
    """An epilog listing the ``--set`` keys of each ``"module:Class"`` in ``targets``."""
    def text() -> str:
        from plasticlm.config import describe

        parts = []
        for target in targets:
            module, name = target.split(":")
            cls = getattr(importlib.import_module(module), name)
            parts.append(f"{name} keys (--set KEY=VALUE), with defaults:\n{describe(cls)}")
        return "\n\n".join(parts)
    return text


def add_config_options(p: argparse.ArgumentParser, *targets: str,
                       quick: str | None = None) -> None:
    """``--config``, ``--set`` (into ``args.overrides``), ``--overwrite`` and, with ``quick``
    (a packaged preset ``METHOD/NAME``), ``--quick``; the key list of ``targets`` goes into
    ``--help``."""
    names = " or ".join(t.split(":")[1] for t in targets)
    p.formatter_class = HelpFormatter
    p.epilog = config_keys(*targets)
    p.add_argument("--config", metavar="FILE", type=non_empty, help=f"TOML/YAML/JSON file of {names} fields")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override one field, dotted for nested ones (repeatable; keys below)")
    add_overwrite_option(p, "out")
    if quick:
        p.add_argument("--quick", action="store_true",
                       help=f"start from the packaged preset configs/{quick}.toml (a smoke test)")
        p.set_defaults(quick_preset=quick)


def add_overwrite_option(p: argparse.ArgumentParser, *outputs: str) -> None:
    """``--overwrite``; ``outputs``: the destinations of ``p`` that name an output folder,
    checked before the command starts (``plasticlm.outputs.check_output``)."""
    p.add_argument("--overwrite", action="store_true",
                   help="let the command add its files to a non-empty folder plasticlm did "
                   "not write (it never removes or replaces anything there)")
    p.set_defaults(output_args=outputs)


def load_from_args(cls, args, extra: list[str] = ()):
    """``cls`` from its defaults, the ``--quick`` preset, ``--config`` and ``--set`` (then
    ``extra`` overrides the command itself adds)."""
    from plasticlm.config import load_config, preset_path

    preset = None
    if getattr(args, "quick", False):
        preset = preset_path(*args.quick_preset.split("/"))
    return load_config(cls, args.config, [*args.overrides, *extra], preset=preset)


def add_runtime_options(p: argparse.ArgumentParser, float32_only: str = "") -> None:
    """``--device`` and ``--dtype`` of every model the command loads; the CLI applies them
    once for the whole command (``runtime.runtime``). ``float32_only``: why this command's
    weights stay float32 (its ``--dtype`` then refuses anything else, saying so)."""
    p.add_argument("--device", default=None, metavar="|".join(DEVICES), type=non_empty,
                   help=f"where models run (default ${DEVICE_ENV}, else auto: CUDA when "
                   "present, else the CPU); cuda:N picks a GPU")
    if float32_only:
        def only_float32(value: str) -> str:
            if value not in ("float32", "fp32"):
                raise argparse.ArgumentTypeError(f"{value!r}: this command runs in float32 "
                                                 f"only ({float32_only})")
            return value

        p.add_argument("--dtype", default=None, type=only_float32, metavar="float32",
                       help=f"float32 only: {float32_only}")
        return
    p.add_argument("--dtype", default=None, choices=DTYPE_NAMES,
                   help=f"dtype the models load in (default ${DTYPE_ENV}, else float32); "
                   "trained adapters (memory, LoRA, fusers) stay float32")


# options that are not settings of the command's work
_NOT_KEYS = ("help", "config", "overrides", "overwrite", "func", "option_parser")


def add_option_config(p: argparse.ArgumentParser) -> None:
    """``--config FILE`` and ``--set KEY=VALUE`` for a command whose settings are its
    options (no config class): a key is an option's name (``max_new_tokens`` or
    ``max-new-tokens``), its value is checked by that option's own type and choices, as if
    typed on the command line. A key given twice (as a flag and by --set or --config) is
    refused."""
    p.add_argument("--config", metavar="FILE", type=non_empty,
                   help="TOML/YAML/JSON file of this command's options by name")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="set one option by name, e.g. --set max_new_tokens=32 (repeatable)")
    p.set_defaults(option_parser=p)


def option_tokens(args: argparse.Namespace, argv: list[str]) -> list[str]:
    """The command-line tokens that ``--config`` and ``--set`` stand for (``[]`` when
    neither is given), to parse again after ``argv``."""
    from plasticlm.config import overrides_tree, read_config_file
    from plasticlm.errors import PlasticError

    if not (getattr(args, "config", None) or getattr(args, "overrides", None)):
        return []
    parser = args.option_parser
    actions = {a.dest: a for a in parser._actions if a.option_strings
               and a.dest not in _NOT_KEYS}
    values = read_config_file(args.config) if args.config else {}
    values.update(overrides_tree(args.overrides))
    given = {a.split("=")[0] for a in argv if a.startswith("--")}
    tokens = []
    for key, value in values.items():
        action = actions.get(key.replace("-", "_"))
        if action is None or isinstance(value, dict):
            raise PlasticError(f"{parser.prog} has no option {key!r}; its keys: "
                               f"{', '.join(sorted(actions))}")
        flag = max(action.option_strings, key=len)
        if given & set(action.option_strings):
            raise PlasticError(f"{key} is given twice ({flag} and --set/--config): give it once")
        if isinstance(action, argparse._StoreTrueAction):
            if not isinstance(value, bool):
                raise PlasticError(f"{key} is a switch: true or false, not {value!r}")
            tokens += [flag] if value else []
        elif isinstance(value, list):
            items = [str(v) for v in value]
            tokens += [t for v in items for t in (flag, v)] \
                if isinstance(action, argparse._AppendAction) else [flag, *items]
        else:
            tokens += [flag, "true" if value is True else "false" if value is False
                       else str(value)]
    return tokens
