import Contracts
import Foundation
import RPCCore
import ServiceKit
import Social
import Synchronization
import Testing

@Suite("Social: pure rules and the hub", .serialized)
struct RulesTests {
    @Test func inviteCodesAreEightCrockfordSymbolsMatchedLeniently() {
        var seen = Set<String>()
        for _ in 0..<2000 {
            let c = InviteCode.make()
            #expect(c.count == 8 && InviteCode.normalise(c) == c)
            seen.insert(c)
        }
        #expect(seen.count == 2000)  // 40 bits: a collision here would be a broken generator
        #expect(InviteCode.display("K7P29XQM") == "K7P2-9XQM")
        #expect(InviteCode.normalise("k7p2-9xqm") == "K7P29XQM")
        #expect(InviteCode.normalise(" K7P2 9XQM ") == "K7P29XQM")
        #expect(InviteCode.normalise("O1IL-0000") == "01110000")  // Crockford: O→0, I/L→1
        #expect(InviteCode.normalise("K7P2-9XQ") == nil)
        #expect(InviteCode.normalise("K7P2-9XQMM") == nil)
        #expect(InviteCode.normalise("K7P2-9XQU") == nil)  // U is not in the alphabet
        #expect(InviteCode.normalise("") == nil)
    }

    @Test func silencingByMuteAndSnooze() {
        let now: Int64 = 1_000_000
        #expect(NotificationRules.silenced(kind: .helpRequest, helpMuted: true, snoozedUntil: nil, now: now))
        #expect(NotificationRules.silenced(kind: .helpOffer, helpMuted: true, snoozedUntil: nil, now: now))
        #expect(!NotificationRules.silenced(kind: .newBid, helpMuted: true, snoozedUntil: nil, now: now))
        #expect(NotificationRules.silenced(kind: .newBid, helpMuted: false, snoozedUntil: now + 1, now: now))
        #expect(!NotificationRules.silenced(kind: .newBid, helpMuted: false, snoozedUntil: now, now: now))  // ended
        #expect(!NotificationRules.silenced(kind: .helpRequest, helpMuted: false, snoozedUntil: now - 5, now: now))
    }

    @Test func rankingOrderIsTotal() {
        let a = RankKey(score: 10, reachedAt: 5, teamID: "B")
        let b = RankKey(score: 10, reachedAt: 5, teamID: "C")
        let c = RankKey(score: 10, reachedAt: 4, teamID: "Z")
        let d = RankKey(score: 11, reachedAt: 9, teamID: "A")
        #expect([a, b, c, d].sorted() == [d, c, a, b])
    }

    @Test func theHubReleasesPublicationsInTicketOrderAndBoundsStreamsPerUser() async throws {
        let hub = NotificationHub(maxPerUser: 2, maxQueued: 10, clock: ManualClock())
        let sub = try hub.register(userID: "u", expiresAt: .max)
        func n(_ id: String) -> NotificationHub.Delivery {
            var x = Social_V1_Notification()
            x.notificationId = id
            return .init(recipient: "u", notification: x)
        }
        let t1 = hub.reserveTicket(), t2 = hub.reserveTicket(), t3 = hub.reserveTicket()
        hub.complete(ticket: t3, notifications: [n("C")])
        hub.complete(ticket: t2, notifications: [n("B")])
        // Nothing released while ticket 1 (an earlier commit) is outstanding.
        hub.complete(ticket: t1, notifications: [])  // its transaction failed: nothing from it
        var got: [String] = []
        while got.count < 2 {
            if case .notifications(let list) = await sub.next() { got += list.map(\.notificationId) }
        }
        #expect(got == ["B", "C"])
        // A third stream for the user closes the oldest.
        _ = try hub.register(userID: "u", expiresAt: .max)
        _ = try hub.register(userID: "u", expiresAt: .max)
        #expect(sub.isClosed && hub.liveCount(userID: "u") == 2)
        if case .closed(let e) = await sub.next() { #expect(e.code == .resourceExhausted) } else { Issue.record("not closed") }
        hub.shutDown()
        #expect(throws: RPCError.self) { try hub.register(userID: "v", expiresAt: .max) }
    }

    @Test func aWaitingStreamWakesOnCancellation() async throws {
        let hub = NotificationHub(maxPerUser: 5, maxQueued: 10, clock: ManualClock())
        let sub = try hub.register(userID: "u", expiresAt: .max)
        let task = Task { await sub.next() }
        try await Task.sleep(for: .milliseconds(50))
        task.cancel()
        if case .closed(let e) = await task.value { #expect(e.code == .cancelled) } else { Issue.record("expected closed") }
        hub.remove(sub)
        #expect(hub.liveCount == 0)
    }
}
