/*
 * FOR_EACH_VALUE_PAIR(M) expands M(p, 2p, 2p+1) for p = 0 .. VALUES_PER_PACKET/2-1.
 *
 * The Tofino form of shared/unroll.p4: a stateful ALU works on a pair of 32-bit
 * words, so values v(2p) and v(2p+1) share register pair_p (as in SwitchML), and
 * 64 values need 32 stateful ALUs instead of 64.
 */
#ifndef _TNA_UNROLL_P4_
#define _TNA_UNROLL_P4_

#include "../shared/size.p4"

#define PAIRS_0_TO_3(M) M(0, 0, 1) M(1, 2, 3) M(2, 4, 5) M(3, 6, 7)
#define PAIRS_4_TO_7(M) M(4, 8, 9) M(5, 10, 11) M(6, 12, 13) M(7, 14, 15)
#define PAIRS_8_TO_11(M) M(8, 16, 17) M(9, 18, 19) M(10, 20, 21) M(11, 22, 23)
#define PAIRS_12_TO_15(M) M(12, 24, 25) M(13, 26, 27) M(14, 28, 29) M(15, 30, 31)
#define PAIRS_16_TO_19(M) M(16, 32, 33) M(17, 34, 35) M(18, 36, 37) M(19, 38, 39)
#define PAIRS_20_TO_23(M) M(20, 40, 41) M(21, 42, 43) M(22, 44, 45) M(23, 46, 47)
#define PAIRS_24_TO_27(M) M(24, 48, 49) M(25, 50, 51) M(26, 52, 53) M(27, 54, 55)
#define PAIRS_28_TO_31(M) M(28, 56, 57) M(29, 58, 59) M(30, 60, 61) M(31, 62, 63)

#if VALUES_PER_PACKET == 8
#define FOR_EACH_VALUE_PAIR(M) PAIRS_0_TO_3(M)
#elif VALUES_PER_PACKET == 16
#define FOR_EACH_VALUE_PAIR(M) PAIRS_0_TO_3(M) PAIRS_4_TO_7(M)
#elif VALUES_PER_PACKET == 32
#define FOR_EACH_VALUE_PAIR(M) PAIRS_0_TO_3(M) PAIRS_4_TO_7(M) PAIRS_8_TO_11(M) PAIRS_12_TO_15(M)
#elif VALUES_PER_PACKET == 64
#define FOR_EACH_VALUE_PAIR(M) PAIRS_0_TO_3(M) PAIRS_4_TO_7(M) PAIRS_8_TO_11(M) PAIRS_12_TO_15(M) PAIRS_16_TO_19(M) PAIRS_20_TO_23(M) PAIRS_24_TO_27(M) PAIRS_28_TO_31(M)
#else
#error "VALUES_PER_PACKET must be 8, 16, 32 or 64"
#endif

// One const entry per worker w of the register tables: bit w of bitmap_before set
// means w's contribution is in already (v1model's seen). Matching it per worker
// spares the stage that computing bitmap_before & worker_bit would take.
#define WORKERS_0_TO_7(M) M(0) M(1) M(2) M(3) M(4) M(5) M(6) M(7)
#define WORKERS_8_TO_15(M) M(8) M(9) M(10) M(11) M(12) M(13) M(14) M(15)
#define WORKERS_16_TO_23(M) M(16) M(17) M(18) M(19) M(20) M(21) M(22) M(23)
#define WORKERS_24_TO_31(M) M(24) M(25) M(26) M(27) M(28) M(29) M(30) M(31)
#if MAX_WORKERS != 32
#error "FOR_EACH_WORKER lists 32 workers: MAX_WORKERS must be 32"
#endif
#define FOR_EACH_WORKER(M) WORKERS_0_TO_7(M) WORKERS_8_TO_15(M) WORKERS_16_TO_23(M) WORKERS_24_TO_31(M)
#define SEEN_BIT(w) (32w1 << w) &&& (32w1 << w)

#endif  // _TNA_UNROLL_P4_
