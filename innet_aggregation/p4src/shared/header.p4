/*
 * Packet headers and metadata.
 *
 * Aggregation packet (UDP destination port in AGG_UDP_PORT_BASE/MASK):
 *
 *   | Ethernet 14 | IPv4 20 | UDP 8 | agg_h 14 | values_h 4*VALUES_PER_PACKET |
 *
 * A WAITING reply is agg_h alone.
 *
 * p4src/protocol.py reads agg_h and values_h from the compiled BMv2 JSON, so the
 * worker packs exactly these fields.
 */
#ifndef _HEADER_P4_
#define _HEADER_P4_

#include "define.p4"
#include "unroll.p4"

header ethernet_h {
    mac_addr_t dst_addr;
    mac_addr_t src_addr;
    bit<16>    ether_type;
}

// ARP for Ethernet/IPv4 only (htype 1, ptype 0x0800), the only kind we answer.
header arp_h {
    bit<16>     htype;
    bit<16>     ptype;
    bit<8>      hlen;
    bit<8>      plen;
    bit<16>     oper;
    mac_addr_t  sender_mac;
    ipv4_addr_t sender_ip;
    mac_addr_t  target_mac;
    ipv4_addr_t target_ip;
}

header ipv4_h {
    bit<4>      version;
    bit<4>      ihl;
    bit<8>      diffserv;
    bit<16>     total_len;
    bit<16>     identification;
    bit<3>      flags;
    bit<13>     frag_offset;
    bit<8>      ttl;
    bit<8>      protocol;
    bit<16>     hdr_checksum;
    ipv4_addr_t src_addr;
    ipv4_addr_t dst_addr;
}

header udp_h {
    bit<16> src_port;
    bit<16> dst_port;
    bit<16> length;
    bit<16> checksum;
}

header agg_h {
    MsgType    msg_type;       // CONTRIBUTION towards the root, RESULT back from it
    job_id_t   job_id;
    set_t      set;            // shadow set; a contribution to one re-arms the other
    slot_t     slot;           // pool index, absolute, within the job's slot range
    pkt_id_t   pkt_id;         // chosen by the worker, echoed in the result
    exponent_t exponent;       // in: the sender's block exponent; out: max over workers
    // Out: how many workers the result sums (the whole tree's). In: not 0 asks for a
    // WAITING reply if the (slot, set) is a duplicate's and unfinished (a worker's
    // timer-driven retransmission; a leaf's partial sum, which holds its count).
    count_t    contributions;
    // In: the sender's fingerprint of its call; out: the sum over the workers
    // (wrapping), which each worker checks against n times its own, so workers that
    // sent different calls all find out. In a WAITING reply: the bitmap of the
    // workers that have contributed.
    fingerprint_t fingerprint;
}

#define VALUE_FIELD(i) value_t v##i;
header values_h {
    FOR_EACH_VALUE(VALUE_FIELD)
}
#undef VALUE_FIELD

// UDP length of a well-formed aggregation packet: UDP 8 + agg_h 14 + values; of a
// WAITING reply, which carries no values; and its IPv4 total length.
const bit<16> AGG_UDP_LENGTH = 8 + 14 + 4 * VALUES_PER_PACKET;
const bit<16> WAITING_UDP_LENGTH = 8 + 14;
const bit<16> WAITING_IPV4_LENGTH = 20 + 8 + 14;

// The controller's command, alone in a PacketOut: P4Runtime serializes the metadata
// as this header in front of the (empty) payload.
@controller_header("packet_out")
header packet_out_h {
    bit<8>  op;        // ControlOp
    bit<8>  job_id;    // the job the controller resets, for the counters' sake
    bit<16> slot;      // pool index
}

struct headers_t {
    packet_out_h packet_out;
    ethernet_h ethernet;
    arp_h      arp;
    ipv4_h     ipv4;
    udp_h      udp;
    agg_h      agg;
    values_h   values;
}

// Ingress state. v1model carries it to egress, standing in for Tofino's bridged
// metadata: egress reads next_step, job_id and worker_id.
struct metadata_t {
    bool            is_agg;          // UDP to the aggregation port range
    NextStep        next_step;
    IngressOutcome  outcome;
    // from the jobs table
    count_t         num_workers;     // contributors at this switch: workers, or child switches
    count_t         total_workers;   // workers the job's results sum, under every leaf
    mcast_group_t   job_group;
    slot_t          first_slot;
    slot_t          num_slots;
    bit<1>          has_parent;      // a leaf: its sums go on to the parent switch
    port_t          parent_port;
    mac_addr_t      parent_mac;
    ipv4_addr_t     parent_ip;
    // from the senders table: who sent it, never taken from the packet
    bool            known_sender;
    bit<1>          from_parent;     // the parent switch, sending its result
    worker_id_t     worker_id;
    worker_bitmap_t worker_bit;
    // per (slot, set) state
    cell_t          cell;
    bit<1>          seen;            // the sender's bit was already set: a retransmission
    bit<1>          first;           // no worker had contributed to this (slot, set)
    worker_bitmap_t contributors;    // the (slot, set)'s bitmap after this packet
    bit<1>          asks;            // the packet asks for a WAITING reply (contributions != 0)
    bit<1>          done;            // all num_workers have contributed
    bit<1>          final;           // a leaf holds the parent's result for it
    count_t         count;           // contributions, FINAL_FLAG masked off
    RegisterOp      register_op;
    // loss simulator
    drop_probability_t drop_probability;
    bool            flooded;
}

#endif  // _HEADER_P4_
