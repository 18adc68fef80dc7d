import Foundation
import Observability
import RPCCore
import Testing

@testable import ServiceKit

/// The pure parts of the kit: field rules, throttles, page tokens, ids.
@Suite struct FieldRulesTests {
    @Test func textIsTrimmedCountedInScalarsAndFreeOfControlCharacters() {
        var e = FieldErrors()
        #expect(FieldRules.text("  Chores \u{1F9F9} ", field: "name", 1...8, into: &e) == "Chores \u{1F9F9}")
        #expect(e.isEmpty)
        FieldRules.text("   ", field: "name", 1...8, into: &e)
        FieldRules.text("123456789", field: "title", 1...8, into: &e)
        FieldRules.text("a\u{0007}b", field: "bell", 0...8, into: &e)
        FieldRules.text("line\nbreak", field: "single", 0...20, into: &e)
        FieldRules.text("line\nbreak", field: "multi", 0...20, multiline: true, into: &e)
        FieldRules.text("", field: "optional", 0...8, into: &e)
        #expect(e.violations.map(\.field) == ["name", "title", "bell", "single"])
        #expect(e.violations[0].description == "required")
        #expect(e.violations[1].description == "must be at most 8 characters")
    }

    @Test func oneErrorNamesAtMost64FieldsAndStaysSmall() {
        var e = FieldErrors()
        for i in 0..<10_000 { e.add("statuses[\(i)]", String(repeating: "x", count: 100)) }
        let error = e.error()
        #expect(error.failure.fields.count == FieldErrors.maxNamed)
        #expect(error.message.count <= 1_100 && error.message.hasPrefix("invalid request: statuses[0]"))
        #expect(e.unnamed == 10_000 - FieldErrors.maxNamed)
    }

    @Test func idempotencyKeysArePrintableASCIIUpTo64() {
        var e = FieldErrors()
        FieldRules.idempotencyKey("retry-7f3a", into: &e)
        FieldRules.idempotencyKey(String(repeating: "k", count: 64), into: &e)
        FieldRules.idempotencyKey("has space", into: &e)  // printable ASCII includes the space
        #expect(e.isEmpty)
        FieldRules.idempotencyKey("", into: &e)
        FieldRules.idempotencyKey("tab\there", into: &e)
        FieldRules.idempotencyKey("é", into: &e)
        FieldRules.idempotencyKey(String(repeating: "k", count: 65), into: &e)
        FieldRules.idempotencyKey("", required: false, into: &e)
        #expect(e.violations.count == 4)
    }

    @Test func pageSizesAndIDLists() {
        var e = FieldErrors()
        #expect(FieldRules.pageSize(0, into: &e) == 20)
        #expect(FieldRules.pageSize(0, defaultSize: 50, into: &e) == 50)
        #expect(FieldRules.pageSize(7, into: &e) == 7)
        #expect(FieldRules.pageSize(1000, into: &e) == 100)
        #expect(FieldRules.pageSize(150, defaultSize: 100, maximum: 200, into: &e) == 150)
        #expect(FieldRules.pageSize(1000, defaultSize: 100, maximum: 200, into: &e) == 200)
        #expect(FieldRules.pageSize(0, defaultSize: 100, maximum: 200, into: &e) == 100)
        #expect(e.isEmpty)
        _ = FieldRules.pageSize(-1, into: &e)
        #expect(e.violations.map(\.field) == ["page_size"])
        var l = FieldErrors()
        #expect(FieldRules.ids(["a", " b ", "a", ""], field: "user_ids", into: &l) == ["a", "b"])
        #expect(l.violations.map(\.field) == ["user_ids[3]"])
        var m = FieldErrors()
        _ = FieldRules.ids([], field: "user_ids", into: &m)
        _ = FieldRules.ids(Array(repeating: "x", count: 3), field: "more", maximum: 2, into: &m)
        #expect(m.violations.map(\.field) == ["user_ids", "more"])
    }

    @Test func clipCountsScalarsAndKeepsCharactersWhole() {
        #expect(FieldRules.clip("short", to: 100) == "short")
        #expect(FieldRules.clip("abcdef", to: 4) == "abc…")
        // A family emoji is one character of 5 scalars (three people joined by two ZWJs).
        let family = "👨\u{200D}👩\u{200D}👧"
        #expect(family.count == 1 && FieldRules.length(family) == 5)
        let title = "Ann: " + String(repeating: family, count: 40)  // 45 characters, 205 scalars
        let clipped = FieldRules.clip(title, to: 100)
        #expect(FieldRules.length(clipped) <= 100 && clipped.hasSuffix("…"))
        #expect(clipped == "Ann: " + String(repeating: family, count: 18) + "…")  // 5 + 90 + 1 scalars; no half family
        // What a receiving service checks (1...100 scalars) accepts it.
        var e = FieldErrors()
        FieldRules.text(clipped, field: "title", 1...100, into: &e)
        #expect(e.isEmpty)
        #expect(FieldRules.clip("ab", to: 1) == "…" && FieldRules.clip("ab", to: 0).isEmpty)
    }

    @Test func emails() {
        for good in ["a@b.co", "first.last+tag@example.org", "ü@bücher.de"] { #expect(FieldRules.isWellFormedEmail(good), "\(good)") }
        for bad in ["", "a", "a@b", "@b.co", "a@.co", "a@b..co", "a b@c.de", "a@b.co\u{0000}", "a@-b.co", "a@@b.co"] {
            #expect(!FieldRules.isWellFormedEmail(bad), "\(bad)")
        }
    }
}

@Suite struct ThrottleTests {
    @Test func reservationsCountAttemptsInFlight() {
        let clock = ManualClock(milliseconds: 1_000_000)
        let t = SlidingWindowThrottle(name: "test", limit: 3, window: .seconds(60), clock: clock)
        var held: [SlidingWindowThrottle.Reservation] = []
        for _ in 0..<3 {
            guard case .success(let r) = t.reserve("k") else { Issue.record("refused under the limit"); return }
            held.append(r)
        }
        // Three in flight: a fourth is refused before any of them finished.
        guard case .failure(let wait) = t.reserve("k") else { Issue.record("a fourth attempt was allowed"); return }
        #expect(wait.milliseconds == 60_000)
        // One turns out fine (released): room for one more. The others failed (kept).
        held[0].release()
        held[1].keep()
        #expect(t.count("k") == 2)
        guard case .success = t.reserve("k") else { Issue.record("a released attempt still counted"); return }
        #expect(t.reserve("k").isFailure)
        // The window slides.
        clock.advance(by: .seconds(61))
        #expect(!t.reserve("k").isFailure)
        #expect(t.reserve("other").isFailure == false)
    }

    @Test func reserveAllIsAllOrNothing() {
        let a = SlidingWindowThrottle(name: "test", limit: 1, window: .seconds(60))
        let b = SlidingWindowThrottle(name: "test", limit: 1, window: .seconds(60))
        _ = b.reserve("addr")
        guard case .failure = SlidingWindowThrottle.reserveAll([(a, "acct"), (b, "addr")]) else {
            Issue.record("reserved past b's limit"); return
        }
        #expect(a.count("acct") == 0, "a's reservation was given back")
    }

    @Test func concurrentReservationsNeverExceedTheLimit() async {
        let t = SlidingWindowThrottle(name: "test", limit: 5, window: .seconds(900))
        let granted = await withTaskGroup(of: Bool.self) { group in
            for _ in 0..<200 { group.addTask { !t.reserve("user:1").isFailure } }
            return await group.reduce(0) { $0 + ($1 ? 1 : 0) }
        }
        #expect(granted == 5)
    }

    @Test func refusedAttemptsAreCountedByLimitName() {
        func rejections(_ limit: String) -> Double {
            ProcessMetrics.sample("throttle_rejections_total", labels: [("limit", limit)], in: ProcessMetrics.exposition()) ?? 0
        }
        let account = SlidingWindowThrottle(name: "metrics_test_per_account", limit: 1, window: .seconds(60))
        let address = SlidingWindowThrottle(name: "metrics_test_per_address", limit: 2, window: .seconds(60))
        let before = (account: rejections("metrics_test_per_account"), address: rejections("metrics_test_per_address"))
        #expect(account.attempt("u-1") == nil)
        #expect(account.attempt("u-2") == nil, "another key has its own window")
        #expect(account.attempt("u-1") != nil)
        #expect(account.reserve("u-1").isFailure)
        #expect(rejections("metrics_test_per_account") == before.account + 2)
        // All or nothing: only the throttle that refused counts a rejection.
        #expect(SlidingWindowThrottle.reserveAll([(address, "10.0.0.1"), (account, "u-2")]).isFailure)
        #expect(rejections("metrics_test_per_account") == before.account + 3)
        #expect(rejections("metrics_test_per_address") == before.address)
        // A check is not an attempt: nothing counted.
        #expect(account.retryAfter("u-1") != nil)
        #expect(rejections("metrics_test_per_account") == before.account + 3)
        // Two throttles with one name share the counter (the label is the limit, not the object).
        let again = SlidingWindowThrottle(name: "metrics_test_per_account", limit: 1, window: .seconds(60))
        _ = again.attempt("u-1")
        _ = again.attempt("u-1")
        #expect(rejections("metrics_test_per_account") == before.account + 4)
    }

    @Test func inFlightKeysClaimOnce() {
        let k = InFlightKeys()
        #expect(k.claim("e1"))
        #expect(!k.claim("e1"))
        k.release("e1")
        #expect(k.claim("e1"))
    }
}

extension Result {
    var isFailure: Bool { if case .failure = self { true } else { false } }
}

@Suite struct PageTokenAndIDTests {
    @Test func tokensAreBoundToTheirFiltersAndUnforgeable() {
        let tokens = PageTokens(key: Array(repeating: 7, count: 32))
        let t = tokens.make(cursor: ["alice", "01J"], filters: "members:h1")
        #expect(tokens.open(t, filters: "members:h1", parts: 2) == ["alice", "01J"])
        #expect(tokens.open(t, filters: "members:h2", parts: 2) == nil)
        #expect(tokens.open(t, filters: "members:h1", parts: 3) == nil)
        #expect(PageTokens(key: Array(repeating: 8, count: 32)).open(t, filters: "members:h1", parts: 2) == nil)
        #expect(tokens.open(t.replacingOccurrences(of: "YWxp", with: "Ym9i"), filters: "members:h1", parts: 2) == nil)
        var e = FieldErrors()
        #expect(tokens.cursor("", filters: "x", parts: 1, into: &e) == nil)
        #expect(e.isEmpty)
        #expect(tokens.cursor("garbage", filters: "x", parts: 1, into: &e) == nil)
        #expect(e.violations.map(\.field) == ["page_token"])
    }

    @Test func ulidsSortByCreationEvenWithinOneMillisecond() {
        let ids = (0..<1000).map { _ in ULID.make(now: 1_700_000_000_000) }
        #expect(ids == ids.sorted())
        #expect(Set(ids).count == 1000)
        #expect(ids.allSatisfy(ULID.isValid))
        #expect(ULID.make(now: 1_700_000_000_001) > ids.last!)
        #expect(!ULID.isValid("not-a-ulid"))
    }
}
