"""kvsim's simulator: configs, engine, costs, outputs, planning (policies and workloads are siblings)."""

from sim.native import activate as _activate_native_build

# First thing: the compiled build of the hot modules, when there is a current one (sim.native).
_activate_native_build()
