"""attnforge's command line: `invoke --list` shows the tasks; each lives in attnforge/cli/."""

import signal

from invoke import Collection

from attnforge.cli import bake as bake_tasks
from attnforge.cli import bisect as bisect_tasks
from attnforge.cli import build as build_tasks
from attnforge.cli import doctor as doctor_tasks
from attnforge.cli import export as export_tasks
from attnforge.cli import kernels as kernel_tasks
from attnforge.cli import matrix as matrix_tasks
from attnforge.cli import mirror as mirror_tasks
from attnforge.cli import patches as patch_tasks
from attnforge.cli import pins as pin_tasks
from attnforge.cli import publish as publish_tasks
from attnforge.cli import validate as validate_tasks
from attnforge.cli import verify as verify_tasks

# `invoke build --help | head` and `invoke --list | less` stop reading early: end quietly, as
# Unix tools do, instead of a BrokenPipeError traceback from whichever print came next.
if hasattr(signal, "SIGPIPE"):
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)

ns = Collection()
ns.add_task(build_tasks.build)
ns.add_task(bake_tasks.bake)
ns.add_task(mirror_tasks.mirror)
ns.add_task(build_tasks.schema)
ns.add_task(build_tasks.arches)
ns.add_task(validate_tasks.validate)
ns.add_task(validate_tasks.report)
ns.add_task(matrix_tasks.matrix_task)
ns.add_task(publish_tasks.publish)
ns.add_task(bisect_tasks.bisect)
ns.add_task(doctor_tasks.doctor)
ns.add_task(export_tasks.export)
ns.add_task(export_tasks.verify_env)
ns.add_task(verify_tasks.verify)
ns.add_collection(Collection.from_module(patch_tasks), "patches")
ns.add_collection(Collection.from_module(kernel_tasks), "kernels")
ns.add_collection(Collection.from_module(pin_tasks), "pins")
