/*
 * Every size and width of the program, each with its reason.
 * Override at compile time with -D (e.g. a small pool for a test build).
 */
#ifndef _SIZE_P4_
#define _SIZE_P4_

// int32 values summed per packet. 64 x 4 B = 256 B of payload, SwitchML's small
// packet: one pass through a Tofino pipe (32 stateful ALUs x 2-word registers),
// and 312 B on the wire. Software targets have no such limit, and every packet
// costs them a fixed share of a system call and a pipeline pass: `make p4` builds
// their program with 256 (1 KiB of values, 1,080 B frames, under a 1500 B MTU).
// p4src/README.md, "Packet size", has the measurements behind both.
#ifndef VALUES_PER_PACKET
#define VALUES_PER_PACKET 64
#endif

// Aggregation slots. A job keeps at most its slot range in flight, so the pool must
// cover the bandwidth-delay product: 1024 slots x 256 B = 256 KiB in flight per
// worker, i.e. 2 ms of RTT at 1 Gb/s (BMv2 and the testbed links are far slower).
// The wire slot field is 15 bits, so at most 32768.
#ifndef POOL_SIZE
#define POOL_SIZE 1024
#endif

// Two shadow sets per slot, so a finished result survives while the next one fills.
#define NUM_CELLS (POOL_SIZE * 2)

// One bit per worker in a 32-bit bitmap: one Tofino stateful-ALU word.
#define MAX_WORKERS 32

// Jobs the switch serves at once; the job id is 8 bits on the wire.
#define MAX_JOBS 16

// Worker-identity entries: every worker of every job.
#define SENDER_TABLE_SIZE (MAX_JOBS * MAX_WORKERS)

// Hosts known to L2 forwarding: a rack's worth of MACs with room to spare.
#define L2_TABLE_SIZE 1024

// Addresses the ARP responder answers for: one service address per job.
#define ARP_TABLE_SIZE MAX_JOBS

// Port-security entries: per job, its service MAC as Ethernet source and as ARP
// sender, and its service IPv4 as IPv4 source or ARP sender (3 ternary entries).
#define SERVICE_SOURCE_TABLE_SIZE (MAX_JOBS * 3)

// Ports with a loss-simulator entry: all of v1model's 9-bit port space.
#define PORT_TABLE_SIZE 512

// Counter sizes: one cell per outcome enum member (see define.p4).
#define NUM_INGRESS_OUTCOMES 17
#define NUM_EGRESS_OUTCOMES 5

#endif  // _SIZE_P4_
