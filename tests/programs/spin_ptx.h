/* PTX for the two kernels every test and benchmark launches.
 *
 * vgpu_spin(ns, counter): every block spins on %globaltimer for `ns`
 *   nanoseconds; block 0 / thread 0 then bumps *counter (if non-zero) so a
 *   host thread can count completions without synchronising.
 * vgpu_empty(): returns at once (launch-cost benchmark).
 *
 * The simulated GPU reads the same names: vgpu_spin occupies `ns` per wave
 * of blocks, vgpu_empty costs nothing.  Loaded with cuModuleLoadData, so no
 * nvcc is needed anywhere.
 */
#ifndef VGPU_SPIN_PTX_H
#define VGPU_SPIN_PTX_H

static const char VGPU_SPIN_PTX[] =
    ".version 7.8\n"
    ".target sm_75\n"
    ".address_size 64\n"
    "\n"
    ".visible .entry vgpu_spin(.param .u64 ns, .param .u64 counter)\n"
    "{\n"
    "  .reg .pred %p<3>;\n"
    "  .reg .b64 %rd<8>;\n"
    "  .reg .b32 %r<4>;\n"
    "  ld.param.u64 %rd1, [ns];\n"
    "  ld.param.u64 %rd2, [counter];\n"
    "  mov.u64 %rd3, %globaltimer;\n"
    "$L_spin:\n"
    "  mov.u64 %rd4, %globaltimer;\n"
    "  sub.u64 %rd5, %rd4, %rd3;\n"
    "  setp.lt.u64 %p1, %rd5, %rd1;\n"
    "  @%p1 bra $L_spin;\n"
    "  setp.eq.u64 %p2, %rd2, 0;\n"
    "  @%p2 bra $L_done;\n"
    "  mov.u32 %r1, %tid.x;\n"
    "  mov.u32 %r2, %ctaid.x;\n"
    "  or.b32 %r3, %r1, %r2;\n"
    "  setp.ne.u32 %p2, %r3, 0;\n"
    "  @%p2 bra $L_done;\n"
    "  atom.global.add.u64 %rd6, [%rd2], 1;\n"
    "$L_done:\n"
    "  ret;\n"
    "}\n"
    "\n"
    ".visible .entry vgpu_empty()\n"
    "{\n"
    "  ret;\n"
    "}\n";

#endif
