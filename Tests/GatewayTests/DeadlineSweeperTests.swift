import RPCCore
import Synchronization
import Testing

@testable import Gateway

@Suite struct DeadlineSweeperTests {
    final class FakeCall: Cancellable {
        let cancels = Atomic<Int>(0)
        func cancel() { cancels.add(1, ordering: .relaxed) }
        var cancelled: Int { cancels.load(ordering: .relaxed) }
    }

    @Test func cancelsOnlyLiveCallsPastTheirCap() {
        let sweeper = DeadlineSweeper()
        let start = ContinuousClock.now
        let (a, b, c) = (FakeCall(), FakeCall(), FakeCall())
        let wa = sweeper.watch(for: .seconds(1)); wa.onCancel(cancelling: a)
        let wb = sweeper.watch(for: .seconds(1)); wb.onCancel(cancelling: b)
        let wc = sweeper.watch(for: .seconds(60)); wc.onCancel(cancelling: c)
        wb.disarm()  // b ended in time
        #expect(sweeper.count == 2)
        #expect(sweeper.sweep(now: start) == 0)
        #expect(sweeper.sweep(now: start + .seconds(2)) == 1)
        #expect(a.cancelled == 1 && b.cancelled == 0 && c.cancelled == 0)
        #expect(wa.isCancelled && !wb.isCancelled && !wc.isCancelled)
        #expect(sweeper.count == 1)
        // An expired watch given its call late cancels at once; sweeping again cancels nothing twice.
        let late = FakeCall()
        let wl = sweeper.watch(for: .zero)
        #expect(sweeper.sweep() == 1)
        wl.onCancel(cancelling: late)
        #expect(late.cancelled == 1)
        #expect(sweeper.sweep(now: start + .seconds(2)) == 0)
        wc.disarm()
        #expect(sweeper.count == 0)
    }

    @Test func finishedWatchesBehindALongCallDoNotPileUp() {
        let sweeper = DeadlineSweeper()
        let long = sweeper.watch(for: .seconds(60))
        long.onCancel(cancelling: FakeCall())
        for _ in 0..<5000 { sweeper.watch(for: .seconds(60)).disarm() }
        sweeper.sweep()
        #expect(sweeper.count == 1)
        #expect(sweeper.queued <= 1024)
    }
}
