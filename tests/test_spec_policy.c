/* When a request drafts (engine/spec_policy.h): it starts drafting, stops
 * after rounds that keep nothing, probes every RP_SPEC_PROBE_EVERY steps,
 * and drafts again once a probe keeps drafts. */
#include "test_util.h"

#include "engine/spec_policy.h"

/* Rounds that keep `kept` until the request stops drafting; how many. */
static int rounds_until_stop(rp_spec_track *t, int kept) {
    int n = 0;
    while (rp_spec_track_wants(t)) {
        rp_spec_track_round(t, kept);
        n++;
        assert_true(n < 100);
    }
    return n;
}

static void test_stops_and_probes(void **state) {
    (void)state;
    rp_spec_track t;
    rp_spec_track_init(&t);
    assert_int_equal(rounds_until_stop(&t, 0), 10); /* 1.0 x 0.875^n < 0.3 at n = 10 */
    /* that "no" was the first plain step: a probe after RP_SPEC_PROBE_EVERY - 1 of them */
    for (int cycle = 0; cycle < 3; cycle++) {
        int plain = 1;
        while (!rp_spec_track_wants(&t)) plain++;
        assert_int_equal(plain, RP_SPEC_PROBE_EVERY - 1);
        rp_spec_track_round(&t, 0); /* the probe keeps nothing */
        assert_false(rp_spec_track_wants(&t));
    }
    /* a probe that keeps drafts brings it back */
    while (!rp_spec_track_wants(&t)) {}
    rp_spec_track_round(&t, 3);
    assert_true(rp_spec_track_wants(&t));
}

/* Rounds that keep enough never stop. */
static void test_keeps_drafting_while_it_pays(void **state) {
    (void)state;
    rp_spec_track t;
    rp_spec_track_init(&t);
    for (int i = 0; i < 1000; i++) {
        assert_true(rp_spec_track_wants(&t));
        rp_spec_track_round(&t, i % 2); /* half a draft a round, above the break-even */
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stops_and_probes),
        cmocka_unit_test(test_keeps_drafting_while_it_pays),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
