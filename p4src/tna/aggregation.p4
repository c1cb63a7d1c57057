/*
 * In-network gradient aggregation for Tofino 1 (TNA), after SwitchML (NSDI'21).
 * NOT YET COMPILED: see README.md in this directory.
 *
 * The same program as v1model/aggregation.p4, with the same controls, tables and
 * counters: workers send CONTRIBUTION packets of VALUES_PER_PACKET int32 values to
 * a slot of the pool; the switch sums them per (slot, shadow set); the last
 * contribution leaves as a RESULT multicast to every worker of the job; a worker
 * that retransmits for a finished slot gets the stored result back by unicast.
 * Everything else is switched at L2.
 *
 * Tofino differences (README.md has the full list):
 *  - every register is a Register + RegisterActions (one stateful ALU each); the
 *    64 sums live in 32 pairs of 32-bit words;
 *  - a stateful ALU returns one word per packet, so a result (completed or
 *    resent) recirculates once: pass 1 updates and reads the high words, pass 2
 *    reads the low words and sends. Consumed contributions take one pass;
 *  - what egress needs travels in bridge_h.
 */
#include <core.p4>
#include <tna.p4>

#include "header.p4"
#include "parser.p4"
#include "control/l2_forwarding.p4"
#include "control/arp_responder.p4"
#include "control/drop_simulator.p4"
#include "control/job_lookup.p4"
#include "control/sender_identification.p4"
#include "control/bitmap_checker.p4"
#include "control/contribution_counter.p4"
#include "control/next_step_selector.p4"
#include "control/value_pair.p4"
#include "control/value_aggregator.p4"
#include "control/exponent_max.p4"
#include "control/result_rewrite.p4"

control AggIngress(inout tna_headers_t hdr,
                   inout metadata_t meta,
                   in ingress_intrinsic_metadata_t ig_intr_md,
                   in ingress_intrinsic_metadata_from_parser_t ig_prsr_md,
                   inout ingress_intrinsic_metadata_for_deparser_t ig_dprsr_md,
                   inout ingress_intrinsic_metadata_for_tm_t ig_tm_md) {
    DropSimulator()        ingress_loss;
    ArpResponder()         arp_responder;
    L2Forwarding()         l2_forwarding;
    JobLookup()            job_lookup;
    SenderIdentification() sender_identification;
    BitmapChecker()        bitmap_checker;
    ContributionCounter()  contribution_counter;
    NextStepSelector()     next_step_selector;
    ValueAggregator()      value_aggregator;
    ExponentMax()          exponent_max;

    Counter<bit<64>, bit<8>>(NUM_INGRESS_OUTCOMES, CounterType_t.PACKETS_AND_BYTES) ingress_outcomes;

    // BitmapChecker's output: the sender's set as it was (read only where written).
    worker_bitmap_t bitmap_before;

    // The packet leaves as a result: from the service address it was sent to.
    action become_result() {
        hdr.agg.msg_type = MsgType.RESULT;
        hdr.agg.contributions = meta.total_workers;
        hdr.ethernet.src_addr = hdr.ethernet.dst_addr;
        hdr.ipv4.src_addr = hdr.ipv4.dst_addr;
        hdr.udp.src_port = hdr.udp.dst_port;
        hdr.udp.checksum = 0;  // the payload changed; 0 means "none" in IPv4
    }

    // Pass 1 of a result ends at the recirculation port; bridge_h carries the
    // decision to pass 2 (and, there, to egress).
    action recirculate_result() {
        hdr.bridge.recirculate = 1;
        hdr.bridge.next_step = meta.next_step;
        hdr.bridge.worker_id = meta.worker_id;
        hdr.bridge.job_group = meta.job_group;
        ig_tm_md.ucast_egress_port = AGG_RECIRC_PORT;
    }

    apply {
        // ValueAggregator is applied once, for both passes: its 32 registers must be
        // the same ones on pass 1 and pass 2.
        bit<1> aggregate = 0;   // a key of the register tables, not a condition (below)
        bit<1> harvest = 0;
        // Unconditionally, so the register index is there from the first stage on.
        meta.cell = hdr.agg.slot ++ hdr.agg.set;

        if (hdr.bridge.isValid()) {
            // Pass 2 of a result, back from the recirculation port: everything was
            // decided and counted in pass 1; read the low words of the sums and send.
            aggregate = 1;
            harvest = 1;
            hdr.bridge.recirculate = 0;
            if (hdr.bridge.next_step == NextStep.MULTICAST) {
                ig_tm_md.mcast_grp_a = hdr.bridge.job_group;
            } else {
                ig_tm_md.ucast_egress_port = hdr.bridge.ingress_port;
            }
        } else {
            hdr.bridge.setValid();
            hdr.bridge.next_step = NextStep.FORWARD_L2;
            hdr.bridge.recirculate = 0;
            hdr.bridge.flooded = 0;
            hdr.bridge._pad0 = 0;
            hdr.bridge.ingress_port = ig_intr_md.ingress_port;
            hdr.bridge._pad1 = 0;
            hdr.bridge.worker_id = 0;
            hdr.bridge.job_group = 0;
            meta.next_step = NextStep.FORWARD_L2;

            if (meta.is_agg) {
                bool lost;
                bool job_found;
                bool in_range;
                meta.next_step = NextStep.DROP;
                // The lookups have no side effects, so all three run, side by side in
                // the first stage, and the checks below decide in v1model's order:
                // gating each on the one before would cost a stage apiece before the
                // bitmap, and the 34 stateful ALUs after it need nine of the twelve.
                ingress_loss.apply(ig_intr_md.ingress_port, lost);
                job_lookup.apply(hdr, meta, job_found, in_range);
                sender_identification.apply(hdr, meta, ig_intr_md.ingress_port);
                if (lost) {
                    meta.outcome = IngressOutcome.SIMULATED_DROP;
                } else if (ig_prsr_md.parser_err != 0   // a short packet: values partial
                           || hdr.udp.length != AGG_UDP_LENGTH
                           || hdr.agg.msg_type != MsgType.CONTRIBUTION) {
                    meta.outcome = IngressOutcome.MALFORMED;
                } else if (!job_found) {
                    meta.outcome = IngressOutcome.UNKNOWN_JOB;
                } else if (hdr.agg.slot >= POOL_SIZE || !in_range) {
                    meta.outcome = IngressOutcome.BAD_SLOT;
                } else if (!meta.known_sender) {
                    meta.outcome = IngressOutcome.UNKNOWN_SENDER;
                } else {
                    aggregate = 1;
                    bitmap_checker.apply(hdr, meta, bitmap_before);
                    contribution_counter.apply(meta, bitmap_before);
                    next_step_selector.apply(meta);
                    exponent_max.apply(hdr, meta, bitmap_before);
                }
                ingress_outcomes.count((bit<8>)meta.outcome);
            }
        }

        // The sums: applied to every packet, with `aggregate` in their key rather
        // than in a condition around them, and before the forwarding decision, which
        // nothing in them needs. Either way round, the 32 register tables would
        // wait stages for what they do not depend on.
        value_aggregator.apply(hdr, meta, bitmap_before, aggregate, harvest);

        if (harvest == 0) {   // pass 1 (pass 2 was sent on its way above)
            if (meta.next_step == NextStep.FORWARD_L2) {
                bool replied;
                arp_responder.apply(hdr, ig_intr_md.ingress_port, ig_tm_md, replied);
                if (!replied) {
                    l2_forwarding.apply(hdr, meta, ig_tm_md);
                    if (meta.flooded) {
                        hdr.bridge.flooded = 1;
                    }
                }
            } else if (meta.next_step == NextStep.MULTICAST
                       || meta.next_step == NextStep.UNICAST) {
                become_result();
                recirculate_result();
            } else {
                ig_dprsr_md.drop_ctl = 1;   // consumed, duplicate, or refused
            }
        }
    }
}

control AggEgress(inout tna_headers_t hdr,
                  inout egress_metadata_t meta,
                  in egress_intrinsic_metadata_t eg_intr_md,
                  in egress_intrinsic_metadata_from_parser_t eg_prsr_md,
                  inout egress_intrinsic_metadata_for_deparser_t eg_dprsr_md,
                  inout egress_intrinsic_metadata_for_output_port_t eg_oport_md) {
    DropSimulator() egress_loss;
    ResultRewrite() result_rewrite;

    Counter<bit<64>, bit<8>>(NUM_EGRESS_OUTCOMES, CounterType_t.PACKETS_AND_BYTES) egress_outcomes;

    apply {
        if (hdr.bridge.recirculate == 1) {
            // Pass 1 of a result on its way to the recirculation port: leaves as it
            // is, bridge_h included, and is neither lost nor counted here.
        } else {
            if (hdr.bridge.next_step == NextStep.MULTICAST
                    || hdr.bridge.next_step == NextStep.UNICAST) {
                bool lost;
                EgressOutcome outcome = EgressOutcome.UNICAST_RESEND;
                worker_id_t worker = hdr.bridge.worker_id;
                if (hdr.bridge.next_step == NextStep.MULTICAST) {
                    outcome = EgressOutcome.MULTICAST_COPY;
                    worker = (worker_id_t)eg_intr_md.egress_rid;
                }
                egress_loss.apply(eg_intr_md.egress_port, lost);
                if (lost) {
                    eg_dprsr_md.drop_ctl = 1;
                    outcome = EgressOutcome.SIMULATED_DROP;
                } else {
                    result_rewrite.apply(hdr, eg_dprsr_md, hdr.agg.job_id, worker);
                    meta.update_ipv4_checksum = true;
                }
                egress_outcomes.count((bit<8>)outcome);
            } else if (hdr.bridge.flooded == 1
                       && eg_intr_md.egress_port == hdr.bridge.ingress_port) {
                eg_dprsr_md.drop_ctl = 1;  // never flood back where it came from
            }
            hdr.bridge.setInvalid();   // bridged metadata never leaves the switch
        }
    }
}

Pipeline(AggIngressParser(),
         AggIngress(),
         AggIngressDeparser(),
         AggEgressParser(),
         AggEgress(),
         AggEgressDeparser()) pipe;

Switch(pipe) main;
