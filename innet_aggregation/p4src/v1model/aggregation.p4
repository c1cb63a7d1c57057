/*
 * In-network gradient aggregation for BMv2 (v1model), after SwitchML (NSDI'21).
 *
 * Workers send CONTRIBUTION packets of VALUES_PER_PACKET int32 values to a slot of
 * the pool. The switch sums them per (slot, shadow set); the last contribution
 * leaves as a RESULT multicast to every worker of the job. A worker that
 * retransmits for a finished slot gets the stored result back by unicast; one
 * that retransmits for an unfinished slot may get a short WAITING reply naming
 * who has contributed. Results carry the sum of the workers' call fingerprints.
 * Everything else is switched at L2.
 *
 * Switches form a tree per job, by table entries alone: a leaf sends its local sum
 * to its parent as one contribution and hands the parent's result to its workers;
 * the root is a one-switch job whose workers include child switches.
 *
 * A job with a deadline (deadline.p4) may have a round released before every worker
 * has contributed: its workers get the partial sum and who is in it.
 */
#include <core.p4>
#include <v1model.p4>

#include "unroll_wide.p4"     // before shared/header.p4: sizes past 256 values
#include "../shared/header.p4"
#include "../shared/deadline.p4"
#include "parser.p4"
#include "control/source_guard.p4"
#include "control/l2_forwarding.p4"
#include "control/arp_responder.p4"
#include "control/drop_simulator.p4"
#include "control/job_lookup.p4"
#include "control/sender_identification.p4"
#include "control/round_tracker.p4"
#include "control/bitmap_checker.p4"
#include "control/contribution_counter.p4"
#include "control/next_step_selector.p4"
#include "control/value_aggregator.p4"
#include "control/exponent_max.p4"
#include "control/fingerprint_sum.p4"
#include "control/result_rewrite.p4"

// A PacketOut op beyond the shared ControlOp, v1model's alone (TNA has no PacketOut
// path yet): the payload, an Ethernet frame, leaves by the port the header's `slot`
// names. The job manager's proof that a host sits behind the port it claims.
const bit<8> CONTROL_OP_SEND_FRAME = 2;

control AggIngress(inout headers_t hdr,
                   inout metadata_t meta,
                   inout standard_metadata_t standard_metadata) {
    SourceGuard()          source_guard;
    DropSimulator()        ingress_loss;
    ArpResponder()         arp_responder;
    L2Forwarding()         l2_forwarding;
    JobLookup()            job_lookup;
    SenderIdentification() sender_identification;
    RoundTracker()         round_tracker;
    BitmapChecker()        bitmap_checker;
    ContributionCounter()  contribution_counter;
    NextStepSelector()     next_step_selector;
    ValueAggregator()      value_aggregator;
    ExponentMax()          exponent_max;
    FingerprintSum()       fingerprint_sum;

    counter(NUM_INGRESS_OUTCOMES, CounterType.packets_and_bytes) ingress_outcomes;
    // Per job (job_id * DEADLINE_OUTCOMES + outcome): what its deadline did.
    counter(256 * DEADLINE_OUTCOMES, CounterType.packets) deadline_outcomes;

    // The packet leaves as a result: from the service address it was sent to.
    action become_result() {
        hdr.agg.msg_type = MsgType.RESULT;
        hdr.agg.contributions = meta.total_workers;
        hdr.ethernet.src_addr = hdr.ethernet.dst_addr;
        hdr.ipv4.src_addr = hdr.ipv4.dst_addr;
        hdr.udp.src_port = hdr.udp.dst_port;
        hdr.udp.checksum = 0;  // the payload changed; 0 means "none" in IPv4
    }

    // A retransmission for an unfinished (slot, set) is answered, back to the
    // sender and without values, with who has contributed (the set's bitmap).
    action become_waiting() {
        hdr.agg.msg_type = MsgType.WAITING;
        hdr.agg.contributions = meta.count;
        hdr.agg.fingerprint = meta.contributors;
        hdr.values.setInvalid();
        hdr.ipv4.total_len = WAITING_IPV4_LENGTH;
        hdr.udp.length = WAITING_UDP_LENGTH;
        hdr.ethernet.src_addr = hdr.ethernet.dst_addr;
        hdr.ipv4.src_addr = hdr.ipv4.dst_addr;
        hdr.udp.src_port = hdr.udp.dst_port;
        hdr.udp.checksum = 0;
        standard_metadata.egress_spec = standard_metadata.ingress_port;
    }

    // A leaf's sum leaves as one contribution to its parent, from this switch's
    // service address (which its parent knows it by) to the parent's.
    action become_partial() {
        hdr.agg.contributions = meta.count;
        hdr.ethernet.src_addr = hdr.ethernet.dst_addr;
        hdr.ethernet.dst_addr = meta.parent_mac;
        hdr.ipv4.src_addr = hdr.ipv4.dst_addr;
        hdr.ipv4.dst_addr = meta.parent_ip;
        hdr.udp.src_port = hdr.udp.dst_port;
        hdr.udp.checksum = 0;
        standard_metadata.egress_spec = meta.parent_port;
    }

    apply {
        deadline_t d = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
        bit<32> deadline_outcome = DEADLINE_OUTCOMES;     // none
        // BMv2 sends to port 0 when nothing sets egress_spec (behavioral-model #992).
        mark_to_drop(standard_metadata);
        meta.next_step = NextStep.FORWARD_L2;
        meta.outcome = IngressOutcome.FORWARDED_L2;

        // A PacketOut has no Ethernet header to check.
        bool spoofed = false;
        if (!hdr.packet_out.isValid()) {
            source_guard.apply(hdr, spoofed);
        }
        if (hdr.packet_out.isValid()) {
            // The controller's, from the CPU port: nothing else parses as one.
            meta.next_step = NextStep.DROP;
            if (hdr.packet_out.op == (bit<8>)ControlOp.RESET_SLOT
                    && (bit<32>)hdr.packet_out.slot < POOL_SIZE) {
                bitmap_checker.apply(hdr, meta, d);
                meta.outcome = IngressOutcome.SLOT_RESET;
            } else if (hdr.packet_out.op == CONTROL_OP_SEND_FRAME
                       && hdr.packet_out.slot < (bit<16>)CPU_PORT) {
                // The payload, unparsed, leaves as it is by the port in `slot`: the
                // header goes and nothing is emitted in front of it. next_step stays
                // DROP, so nothing after this touches the frame; egress_spec sends it.
                meta.outcome = IngressOutcome.FORWARDED_L2;
                standard_metadata.egress_spec = (port_t)hdr.packet_out.slot;
                hdr.packet_out.setInvalid();
            } else {
                meta.outcome = IngressOutcome.MALFORMED;
            }
        } else if (spoofed) {
            meta.next_step = NextStep.DROP;
            meta.outcome = IngressOutcome.SPOOFED_SOURCE;
        } else if (meta.is_agg) {
            bool lost;
            bool job_found;
            meta.next_step = NextStep.DROP;
            ingress_loss.apply(standard_metadata.ingress_port, lost);
            if (lost) {
                meta.outcome = IngressOutcome.SIMULATED_DROP;
            } else if (standard_metadata.parser_error != error.NoError
                       || (hdr.agg.msg_type == MsgType.WAITING
                           && hdr.udp.length != WAITING_UDP_LENGTH)
                       || (hdr.agg.msg_type != MsgType.WAITING
                           && (!hdr.values.isValid() || hdr.udp.length != AGG_UDP_LENGTH))
                       || (hdr.agg.msg_type != MsgType.CONTRIBUTION
                           && hdr.agg.msg_type != MsgType.RESULT
                           && hdr.agg.msg_type != MsgType.WAITING
                           && (bit<8>)hdr.agg.msg_type != MSG_RELEASE
                           && (bit<8>)hdr.agg.msg_type != MSG_QUORUM)) {
                meta.outcome = IngressOutcome.MALFORMED;
            } else {
                job_lookup.apply(hdr, meta, job_found);
                if (!job_found) {
                    meta.outcome = IngressOutcome.UNKNOWN_JOB;
                } else if ((bit<32>)hdr.agg.slot >= POOL_SIZE
                           || hdr.agg.slot - meta.first_slot >= meta.num_slots) {
                    // The second test also catches slot < first_slot, by wrap-around.
                    meta.outcome = IngressOutcome.BAD_SLOT;
                } else {
                    sender_identification.apply(hdr, meta, standard_metadata);
                    if (!meta.known_sender) {
                        meta.outcome = IngressOutcome.UNKNOWN_SENDER;
                    } else if ((meta.from_parent == 1)
                               != (hdr.agg.msg_type != MsgType.CONTRIBUTION
                                   && (bit<8>)hdr.agg.msg_type != MSG_RELEASE
                                   && (bit<8>)hdr.agg.msg_type != MSG_QUORUM)) {
                        // Workers send contributions, releases and quorums only, a parent
                        // results and WAITING replies only.
                        meta.outcome = IngressOutcome.MALFORMED;
                    } else if (hdr.agg.msg_type == MsgType.WAITING) {
                        // The parent still waits for another child: the workers
                        // learn who is missing from this switch's replies alone.
                        meta.outcome = IngressOutcome.PARENT_WAITING;
                    } else {
                        meta.cell = hdr.agg.slot ++ hdr.agg.set;
                        d.release = ((bit<8>)hdr.agg.msg_type == MSG_RELEASE) ? 1w1 : 1w0;
                        d.quorum = ((bit<8>)hdr.agg.msg_type == MSG_QUORUM) ? 1w1 : 1w0;
                        // A QUORUM's `contributions` is its quorum, never an ask.
                        meta.asks = (d.quorum == 0 && hdr.agg.contributions != 0) ? 1w1 : 1w0;
                        round_tracker.apply(hdr, meta, d);
                        if ((d.release == 1 || d.quorum == 1)
                                && (d.on == 0 || meta.has_parent == 1
                                    || (d.quorum == 1 && hdr.agg.contributions == 0))) {
                            // Only a job with a deadline releases, and only at its root;
                            // a quorum of none is no quorum.
                            meta.outcome = IngressOutcome.MALFORMED;
                            deadline_outcome = DEADLINE_RELEASE_REFUSED;
                        } else {
                            // The parent is not a worker here: it has no bit to mark.
                            meta.seen = 0;
                            meta.first = 0;
                            if (meta.from_parent == 0) {
                                bitmap_checker.apply(hdr, meta, d);
                            }
                            contribution_counter.apply(hdr, meta, d);
                            next_step_selector.apply(meta, d);
                            value_aggregator.apply(hdr, meta);
                            exponent_max.apply(hdr, meta);
                            fingerprint_sum.apply(hdr, meta, d);
                            if (d.stale == 1) {
                                deadline_outcome = DEADLINE_STALE;
                            } else if (d.empty == 1) {
                                deadline_outcome = DEADLINE_RELEASE_REFUSED;
                            } else if (d.reached == 1) {
                                deadline_outcome = DEADLINE_QUORUM;
                            } else if (d.record == 1) {
                                deadline_outcome = DEADLINE_RELEASED;
                            } else if (d.as_released == 1 && d.release == 0
                                       && (hdr.agg.fingerprint & meta.worker_bit) == 0) {
                                deadline_outcome = DEADLINE_LATE;
                            }
                        }
                    }
                }
            }
        }
        ingress_outcomes.count((bit<32>)(bit<8>)meta.outcome);
        if (deadline_outcome != DEADLINE_OUTCOMES) {
            deadline_outcomes.count((bit<32>)hdr.agg.job_id * DEADLINE_OUTCOMES
                                    + deadline_outcome);
        }

        if (meta.next_step == NextStep.FORWARD_L2) {
            bool replied;
            arp_responder.apply(hdr, standard_metadata, replied);
            if (!replied) {
                l2_forwarding.apply(hdr, meta, standard_metadata);
            }
        } else if (meta.next_step == NextStep.MULTICAST) {
            become_result();
            standard_metadata.mcast_grp = meta.job_group;
        } else if (meta.next_step == NextStep.UNICAST) {
            become_result();
            standard_metadata.egress_spec = standard_metadata.ingress_port;
        }
        if (d.as_released == 1) {
            // Who is in it: how many (and, in the fingerprint's place, which).
            hdr.agg.msg_type = (MsgType)MSG_RELEASED;
            hdr.agg.contributions = meta.count;
        } else if (meta.next_step == NextStep.WAITING) {
            become_waiting();
        } else if (meta.next_step == NextStep.UPSTREAM) {
            become_partial();
        }
    }
}

control AggEgress(inout headers_t hdr,
                  inout metadata_t meta,
                  inout standard_metadata_t standard_metadata) {
    DropSimulator() egress_loss;
    ResultRewrite() result_rewrite;

    counter(NUM_EGRESS_OUTCOMES, CounterType.packets_and_bytes) egress_outcomes;

    apply {
        if (meta.next_step == NextStep.MULTICAST || meta.next_step == NextStep.UNICAST
                || meta.next_step == NextStep.WAITING || meta.next_step == NextStep.UPSTREAM) {
            bool lost;
            EgressOutcome outcome = EgressOutcome.UNICAST_RESEND;
            worker_id_t worker = meta.worker_id;
            if (meta.next_step == NextStep.MULTICAST) {
                outcome = EgressOutcome.MULTICAST_COPY;
                worker = (worker_id_t)standard_metadata.egress_rid;
            } else if (meta.next_step == NextStep.WAITING) {
                outcome = EgressOutcome.WAITING_REPLY;
            } else if (meta.next_step == NextStep.UPSTREAM) {
                outcome = EgressOutcome.UPSTREAM;
            }
            egress_loss.apply(standard_metadata.egress_port, lost);
            if (lost) {
                mark_to_drop(standard_metadata);
                outcome = EgressOutcome.SIMULATED_DROP;
            } else if (meta.next_step != NextStep.UPSTREAM) {
                result_rewrite.apply(hdr, standard_metadata, hdr.agg.job_id, worker);
            }
            egress_outcomes.count((bit<32>)(bit<8>)outcome);
        } else if (meta.flooded
                   && standard_metadata.egress_port == standard_metadata.ingress_port) {
            mark_to_drop(standard_metadata);  // never flood back where it came from
        }
    }
}

V1Switch(AggParser(),
         AggVerifyChecksum(),
         AggIngress(),
         AggEgress(),
         AggComputeChecksum(),
         AggDeparser()) main;
