/*
 * FOR_EACH_VALUE(M) expands M(i) for i = 0 .. VALUES_PER_PACKET-1.
 *
 * P4 has no loops and no arrays of externs, so one register per value is spelled
 * out by the preprocessor from the single constant in size.p4.
 */
#ifndef _UNROLL_P4_
#define _UNROLL_P4_

#include "size.p4"

#define VALUES_0_TO_7(M) M(0) M(1) M(2) M(3) M(4) M(5) M(6) M(7)
#define VALUES_8_TO_15(M) M(8) M(9) M(10) M(11) M(12) M(13) M(14) M(15)
#define VALUES_16_TO_23(M) M(16) M(17) M(18) M(19) M(20) M(21) M(22) M(23)
#define VALUES_24_TO_31(M) M(24) M(25) M(26) M(27) M(28) M(29) M(30) M(31)
#define VALUES_32_TO_39(M) M(32) M(33) M(34) M(35) M(36) M(37) M(38) M(39)
#define VALUES_40_TO_47(M) M(40) M(41) M(42) M(43) M(44) M(45) M(46) M(47)
#define VALUES_48_TO_55(M) M(48) M(49) M(50) M(51) M(52) M(53) M(54) M(55)
#define VALUES_56_TO_63(M) M(56) M(57) M(58) M(59) M(60) M(61) M(62) M(63)

#if VALUES_PER_PACKET == 8
#define FOR_EACH_VALUE(M) VALUES_0_TO_7(M)
#elif VALUES_PER_PACKET == 16
#define FOR_EACH_VALUE(M) VALUES_0_TO_7(M) VALUES_8_TO_15(M)
#elif VALUES_PER_PACKET == 32
#define FOR_EACH_VALUE(M) VALUES_0_TO_7(M) VALUES_8_TO_15(M) VALUES_16_TO_23(M) VALUES_24_TO_31(M)
#elif VALUES_PER_PACKET == 64
#define FOR_EACH_VALUE(M) VALUES_0_TO_7(M) VALUES_8_TO_15(M) VALUES_16_TO_23(M) VALUES_24_TO_31(M) VALUES_32_TO_39(M) VALUES_40_TO_47(M) VALUES_48_TO_55(M) VALUES_56_TO_63(M)
#else
#error "VALUES_PER_PACKET must be 8, 16, 32 or 64"
#endif

#endif  // _UNROLL_P4_
