import Testing

@testable import Matchmaking

/// The queue's bookkeeping on its own, where the moments between a pairing and its match can be
/// held still.
@Suite("Matchmaking: queue")
struct QueueTests {
    /// A reconnect (a second JoinQueue) while the first ticket's match is being written makes no
    /// second ticket, which a later pass could pair again while the player is in a match; before
    /// the match is claimed, the newer stream takes the ticket over; once the match is given up,
    /// a join is a join again.
    @Test func aJoinWhileTheMatchIsBeingWrittenMakesNoSecondTicket() {
        let queue = MatchQueue(lifetime: .seconds(60), statusEvery: .seconds(5))
        let sa = MatchQueue.Stream(), sb = MatchQueue.Stream()
        #expect(queue.join(userID: "a", rating: 1500, ticketID: "t-a", now: 0, stream: sa).ticket?.ticketID == "t-a")
        #expect(queue.join(userID: "b", rating: 1500, ticketID: "t-b", now: 0, stream: sb).ticket != nil)
        let (pairs, _) = queue.pass(now: 1, neighbors: 4) { _, _ in false }
        #expect(pairs.count == 1)
        #expect(sa.claim() && sb.claim())  // as the match's transaction does

        let again = MatchQueue.Stream()
        guard case .beingMatched = queue.join(userID: "a", rating: 1500, ticketID: "t-a2", now: 2, stream: again) else {
            Issue.record("a second ticket while the match is being written")
            return
        }
        #expect(queue.ticket(of: "a") == nil && queue.count == 0)
        #expect(sa.isOpen)  // the stream being matched is left alone

        // The match was not written after all: the pair goes back, and a join reattaches.
        sa.unclaim()
        sb.unclaim()
        queue.putBack([pairs[0].0, pairs[0].1])
        let third = MatchQueue.Stream()
        #expect(queue.join(userID: "a", rating: 1500, ticketID: "t-a3", now: 3, stream: third).ticket?.ticketID == "t-a")
        #expect(queue.count == 2)
    }
}
