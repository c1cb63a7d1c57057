/*
 * FOR_EACH_VALUE(M) for the packet sizes only software targets take: 512 and 1024
 * values per packet (2 and 4 KiB of values, a jumbo MTU).
 *
 * shared/unroll.p4 spells out sizes up to 256 and stops there; the Tofino program's
 * sources include it, and a size Tofino cannot place is no reason to change them.
 * For a larger size this file stands in for it (it takes its include guard), so it
 * must come before shared/header.p4. The numbers are pasted from digits instead of
 * listed: TENS(M, 25) is M(250) .. M(259), HUNDREDS(M, 3) is M(300) .. M(399).
 */
#ifndef _UNROLL_WIDE_P4_
#define _UNROLL_WIDE_P4_

#include "../shared/size.p4"

#if VALUES_PER_PACKET > 256
#define _UNROLL_P4_

#define TENS(M, p) M(p##0) M(p##1) M(p##2) M(p##3) M(p##4) M(p##5) M(p##6) M(p##7) M(p##8) M(p##9)
#define HUNDREDS(M, h) TENS(M, h##0) TENS(M, h##1) TENS(M, h##2) TENS(M, h##3) TENS(M, h##4) \
    TENS(M, h##5) TENS(M, h##6) TENS(M, h##7) TENS(M, h##8) TENS(M, h##9)
#define VALUES_0_TO_99(M) M(0) M(1) M(2) M(3) M(4) M(5) M(6) M(7) M(8) M(9) TENS(M, 1) \
    TENS(M, 2) TENS(M, 3) TENS(M, 4) TENS(M, 5) TENS(M, 6) TENS(M, 7) TENS(M, 8) TENS(M, 9)

#if VALUES_PER_PACKET == 512
#define FOR_EACH_VALUE(M) VALUES_0_TO_99(M) HUNDREDS(M, 1) HUNDREDS(M, 2) HUNDREDS(M, 3) \
    HUNDREDS(M, 4) TENS(M, 50) M(510) M(511)
#elif VALUES_PER_PACKET == 1024
#define FOR_EACH_VALUE(M) VALUES_0_TO_99(M) HUNDREDS(M, 1) HUNDREDS(M, 2) HUNDREDS(M, 3) \
    HUNDREDS(M, 4) HUNDREDS(M, 5) HUNDREDS(M, 6) HUNDREDS(M, 7) HUNDREDS(M, 8) HUNDREDS(M, 9) \
    TENS(M, 100) TENS(M, 101) M(1020) M(1021) M(1022) M(1023)
#else
#error "VALUES_PER_PACKET past 256 must be 512 or 1024"
#endif
#endif

#endif  // _UNROLL_WIDE_P4_
