/*
 * Per slot, which workers have contributed to each shadow set.
 *
 * One register word per slot holds both sets' bitmaps (a 2 x 32-bit pair, one
 * stateful ALU in dual mode), so one read-modify-write marks the sender in its set
 * and clears it in the other: contributing to set s re-arms set 1-s, and workers
 * reuse slots forever without any reset (SwitchML).
 *
 * TNA form of v1model/control/bitmap_checker.p4. A stateful ALU returns one word,
 * so the action for set s returns set s's bitmap as it was before (bitmap_before).
 * v1model's seen (the sender's bit set in it) and first (bitmap_before == 0) are
 * not computed here: the tables that need them (ContributionCounter, ValuePair,
 * ExponentMax) match (worker_id, bitmap_before) directly, one entry per worker
 * (FOR_EACH_WORKER), in the stage right after this one; computing seen would cost
 * a stage. ContributionCounter writes meta.seen / meta.first.
 */
#ifndef _TNA_BITMAP_CHECKER_P4_
#define _TNA_BITMAP_CHECKER_P4_

control BitmapChecker(in tna_headers_t hdr,
                      in metadata_t meta,
                      out worker_bitmap_t bitmap_before) {
    Register<worker_bitmap_pair_t, slot_t>(POOL_SIZE) bitmaps;

    RegisterAction<worker_bitmap_pair_t, slot_t, worker_bitmap_t>(bitmaps) mark_set0 = {
        void apply(inout worker_bitmap_pair_t pair, out worker_bitmap_t before) {
            before = pair.set0;
            pair.set0 = pair.set0 | meta.worker_bit;
            pair.set1 = pair.set1 & ~meta.worker_bit;
        }
    };

    RegisterAction<worker_bitmap_pair_t, slot_t, worker_bitmap_t>(bitmaps) mark_set1 = {
        void apply(inout worker_bitmap_pair_t pair, out worker_bitmap_t before) {
            before = pair.set1;
            pair.set0 = pair.set0 & ~meta.worker_bit;
            pair.set1 = pair.set1 | meta.worker_bit;
        }
    };

    action check_and_mark_set0() {
        bitmap_before = mark_set0.execute(hdr.agg.slot);
    }

    action check_and_mark_set1() {
        bitmap_before = mark_set1.execute(hdr.agg.slot);
    }

    table check_and_mark {
        key = { hdr.agg.set: exact @name("set"); }
        actions = { check_and_mark_set0; check_and_mark_set1; @defaultonly NoAction; }
        const entries = {
            0: check_and_mark_set0();
            1: check_and_mark_set1();
        }
        // Never taken (set is 1 bit); a register action cannot be a default action
        // on Tofino (its index needs the hash distribution unit).
        const default_action = NoAction();
    }

    apply {
        check_and_mark.apply();
    }
}

#endif  // _TNA_BITMAP_CHECKER_P4_
