/*
 * Per slot, which workers have contributed to each shadow set.
 *
 * One register word per slot holds both sets' bitmaps, so one read-modify-write
 * marks the sender in its set and clears it in the other: contributing to set s
 * re-arms set 1-s, and workers reuse slots forever without any reset (SwitchML).
 * The set's bitmap after the packet (contributors) answers a retransmission for an
 * unfinished set: who the switch still waits for. After a failed call the
 * controller can clear a job's slots with PacketOuts.
 *
 * In a deadline job (deadline.p4) a release, a contribution to a released round and
 * a stale packet mark nobody: they only read who is in the round. The first packet of
 * a round after one some worker skipped starts the set over, so a skipped round's bit
 * does not count in the next. That first packet is what re-arms a set there, so a
 * contribution leaves the other set's bitmap as it is: a round released at its quorum
 * keeps who is in it, and a worker that comes later is not taken for its first.
 */
#ifndef _BITMAP_CHECKER_P4_
#define _BITMAP_CHECKER_P4_

control BitmapChecker(in headers_t hdr, inout metadata_t meta, in deadline_t d) {
    register<bitmap_pair_t>(POOL_SIZE) bitmaps;

    action check_and_mark() {
        bitmap_pair_t pair;
        bitmaps.read(pair, (bit<32>)hdr.agg.slot);
        worker_bitmap_t set0 = pair[31:0];
        worker_bitmap_t set1 = pair[63:32];
        worker_bitmap_t before = (d.fresh == 1) ? 0 : ((hdr.agg.set == 0) ? set0 : set1);
        worker_bitmap_t mark = (d.release == 1 || d.released == 1 || d.stale == 1)
                               ? 0 : meta.worker_bit;
        worker_bitmap_t rearm = (d.on == 1) ? 0 : mark;
        worker_bitmap_t new0 = (hdr.agg.set == 0) ? ((d.fresh == 1) ? mark : (set0 | mark))
                                                  : (set0 & ~rearm);
        worker_bitmap_t new1 = (hdr.agg.set == 0) ? (set1 & ~rearm)
                                                  : ((d.fresh == 1) ? mark : (set1 | mark));
        bitmaps.write((bit<32>)hdr.agg.slot, new1 ++ new0);
        meta.seen = ((before & meta.worker_bit) != 0) ? 1w1 : 1w0;
        meta.first = (before == 0) ? 1w1 : 1w0;
        meta.contributors = before | mark;
    }

    // The controller's reset: both sets empty, as on a fresh switch. Counts and
    // values need nothing: the next contribution is a first one and overwrites them.
    action clear_slot() {
        bitmaps.write((bit<32>)hdr.packet_out.slot, 0);
    }

    apply {
        if (hdr.packet_out.isValid()) {
            clear_slot();
        } else {
            check_and_mark();
        }
    }
}

#endif  // _BITMAP_CHECKER_P4_
