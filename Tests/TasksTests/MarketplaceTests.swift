import Contracts
import Foundation
import RPCCore
import Security
import ServiceKit
import ServiceKitTesting
import Testing

@testable import Tasks

// Images as the magic bytes make them (the rest random).
let jpeg: [UInt8] = [0xFF, 0xD8, 0xFF, 0xE0, 0x00, 0x10] + Array("JFIF".utf8) + SecureRandom.bytes(200)
let png: [UInt8] = [0x89, 0x50, 0x4E, 0x47, 0x0D, 0x0A, 0x1A, 0x0A] + SecureRandom.bytes(100)
let webp: [UInt8] = Array("RIFF".utf8) + [0x20, 0, 0, 0] + Array("WEBPVP8 ".utf8) + SecureRandom.bytes(64)

func point(_ lat: Double, _ lon: Double) -> Common_V1_GeoPoint {
    var p = Common_V1_GeoPoint()
    p.latitude = lat
    p.longitude = lon
    return p
}

func newMarketTask(
    _ title: String = "Assemble IKEA desk", description: String = "", at location: Common_V1_GeoPoint? = nil, photos: [[UInt8]] = [],
    key: String = UUID().uuidString
) -> Tasks_V1_CreateMarketTaskRequest {
    var r = Tasks_V1_CreateMarketTaskRequest()
    r.idempotencyKey = key
    r.title = title
    r.description_p = description
    if let location { r.location = location }
    r.photos = photos
    return r
}

func bidRequest(_ task: String, _ cents: Int64, _ currency: String = "CAD", key: String = UUID().uuidString) -> Tasks_V1_PlaceBidRequest {
    var r = Tasks_V1_PlaceBidRequest()
    r.idempotencyKey = key
    r.taskId = task
    r.amount.amountCents = cents
    r.amount.currency = currency
    return r
}

/// The outcome of a call, failure included (for calls raced against each other).
func attempt<T: Sendable>(_ body: @Sendable () async throws -> T) async -> Result<T, any Error> {
    do { return .success(try await body()) } catch { return .failure(error) }
}

extension World {
    func post(_ who: User, _ r: Tasks_V1_CreateMarketTaskRequest) async throws -> Tasks_V1_MarketTask {
        try await tasks.createMarketTask(r, options: who.options).task
    }
    func bid(_ who: User, _ task: String, _ cents: Int64) async throws -> Tasks_V1_Bid {
        try await tasks.placeBid(bidRequest(task, cents), options: who.options).bid
    }
    func get(_ who: User, _ task: String) async throws -> Tasks_V1_MarketTask {
        var r = Tasks_V1_GetMarketTaskRequest()
        r.taskId = task
        return try await tasks.getMarketTask(r, options: who.options).task
    }
    func accept(_ who: User, _ bid: String) async throws -> Tasks_V1_MarketTask {
        var r = Tasks_V1_AcceptBidRequest()
        r.bidId = bid
        return try await tasks.acceptBid(r, options: who.options).task
    }
    func done(_ who: User, _ task: String) async throws -> Tasks_V1_MarketTask {
        var r = Tasks_V1_MarkMarketTaskDoneRequest()
        r.taskId = task
        return try await tasks.markMarketTaskDone(r, options: who.options).task
    }
    func list(
        _ who: User, _ scope: Tasks_V1_MarketTaskScope, _ statuses: [Tasks_V1_MarketTaskStatus] = [], pageSize: Int32 = 0
    ) async throws
        -> [Tasks_V1_MarketTask]
    {
        var r = Tasks_V1_ListMarketTasksRequest()
        r.scope = scope
        r.statuses = statuses
        r.pageSize = pageSize
        var out: [Tasks_V1_MarketTask] = []
        repeat {
            let page = try await tasks.listMarketTasks(r, options: who.options)
            out += page.tasks
            r.pageToken = page.nextPageToken
        } while !r.pageToken.isEmpty
        return out
    }
}

@Suite("Tasks: the marketplace over gRPC", .serialized)
struct MarketplaceTests {
    @Test func requestEditDeleteWithPhotosReadBackByteForByte() async throws {
        try await withWorld { w in
            let (alice, bob) = (try await w.user("alice"), try await w.user("bob"))
            let created = try await w.tasks.createMarketTask(
                newMarketTask(
                    "  Assemble desk ", description: "Second floor\nno elevator", at: point(53.5232, -113.5263), photos: [jpeg, png, webp],
                    key: "k1"), options: alice.options)
            let t = created.task
            #expect(t.title == "Assemble desk" && t.status == .requested && t.bidCount == 0 && !t.hasLowestBid && !t.hasAcceptedBid)
            #expect(t.requester.userId == alice.id && t.requester.username == alice.username)
            #expect(t.photos.map(\.contentType) == ["image/jpeg", "image/png", "image/webp"])
            #expect(t.photos.map(\.sizeBytes) == [Int64(jpeg.count), Int64(png.count), Int64(webp.count)])
            #expect(t.location.latitude == 53.5232 && t.location.longitude == -113.5263)
            // Photos come back byte for byte, to anyone while the task is open.
            for (p, bytes) in zip(t.photos, [jpeg, png, webp]) {
                var g = Tasks_V1_GetMarketTaskPhotoRequest()
                g.taskId = t.taskId
                g.photoId = p.photoId
                let back = try await w.tasks.getMarketTaskPhoto(g, options: bob.options)
                #expect(back.data == bytes && back.photo == p)
            }
            var missingPhoto = Tasks_V1_GetMarketTaskPhotoRequest()
            missingPhoto.taskId = t.taskId
            missingPhoto.photoId = "ph_9"
            await expectFailure(.notFound) { try await w.tasks.getMarketTaskPhoto(missingPhoto, options: bob.options) }
            await expectFailure(.invalidArgument, fields: ["task_id", "photo_id"]) {
                try await w.tasks.getMarketTaskPhoto(Tasks_V1_GetMarketTaskPhotoRequest(), options: bob.options)
            }

            // A retry creates nothing twice; the key with another request is refused.
            let again = try await w.tasks.createMarketTask(
                newMarketTask(
                    "  Assemble desk ", description: "Second floor\nno elevator", at: point(53.5232, -113.5263), photos: [jpeg, png, webp],
                    key: "k1"), options: alice.options)
            #expect(again.replayed && again.task.taskId == t.taskId)
            await expectFailure(.failedPrecondition, fields: ["idempotency_key"]) {
                try await w.tasks.createMarketTask(newMarketTask("Other", key: "k1"), options: alice.options)
            }
            #expect(try await w.list(alice, .requestedByMe).count == 1)

            // Every bad field at once.
            var bad = newMarketTask(String(repeating: "x", count: 31), description: String(repeating: "y", count: 301), at: point(91, -181))
            bad.photos = [Array("<html>".utf8), [], jpeg]
            bad.idempotencyKey = ""
            await expectFailure(
                .invalidArgument,
                fields: ["idempotency_key", "title", "description", "location.latitude", "location.longitude", "photos[0]", "photos[1]"]
            ) { try await w.tasks.createMarketTask(bad, options: alice.options) }
            await expectFailure(.invalidArgument, fields: ["photos", "photos[6]"]) {
                try await w.tasks.createMarketTask(newMarketTask(photos: [jpeg, jpeg, jpeg, jpeg, jpeg, jpeg, [1, 2, 3]]), options: alice.options)
            }
            await expectFailure(.invalidArgument, fields: ["photos[0]"]) {
                try await w.tasks.createMarketTask(
                    newMarketTask(photos: [[0xFF, 0xD8, 0xFF] + [UInt8](repeating: 0, count: 262_142)]), options: alice.options)
            }
            await expectFailure(.unauthenticated) { try await w.tasks.createMarketTask(newMarketTask()) }

            // Edit: title, location removed, a photo swapped; only the requester; total ≤ 5.
            var edit = Tasks_V1_UpdateMarketTaskRequest()
            edit.taskId = t.taskId
            edit.title.value = "Assemble desk + chair"
            edit.location = Tasks_V1_MarketTaskLocationUpdate()
            edit.removePhotoIds = [t.photos[0].photoId]
            edit.addPhotos = [png]
            await expectFailure(.permissionDenied) { try await w.tasks.updateMarketTask(edit, options: bob.options) }
            let edited = try await w.tasks.updateMarketTask(edit, options: alice.options).task
            #expect(edited.title == "Assemble desk + chair" && !edited.hasLocation && edited.description_p == t.description_p)
            #expect(edited.photos.map(\.photoId) == [t.photos[1].photoId, t.photos[2].photoId, "ph_4"])
            var tooMany = Tasks_V1_UpdateMarketTaskRequest()
            tooMany.taskId = t.taskId
            tooMany.addPhotos = [jpeg, jpeg, jpeg]
            await expectFailure(.invalidArgument, fields: ["add_photos"]) { try await w.tasks.updateMarketTask(tooMany, options: alice.options) }
            var unknown = Tasks_V1_UpdateMarketTaskRequest()
            unknown.taskId = t.taskId
            unknown.removePhotoIds = ["ph_1", "ph_77"]
            await expectFailure(.notFound, fields: ["remove_photo_ids[0]", "remove_photo_ids[1]"]) {
                try await w.tasks.updateMarketTask(unknown, options: alice.options)
            }
            var badEdit = Tasks_V1_UpdateMarketTaskRequest()
            badEdit.taskId = t.taskId
            badEdit.title.value = " "
            badEdit.description_p.value = String(repeating: "d", count: 301)
            badEdit.location.location = point(0, 200)
            await expectFailure(.invalidArgument, fields: ["title", "description", "location.location.longitude"]) {
                try await w.tasks.updateMarketTask(badEdit, options: alice.options)
            }

            // Delete: requester only; bidders are told; the task and its photos are gone.
            let b = try await w.bid(bob, t.taskId, 4500)
            var del = Tasks_V1_DeleteMarketTaskRequest()
            del.taskId = t.taskId
            await expectFailure(.permissionDenied) { try await w.tasks.deleteMarketTask(del, options: bob.options) }
            _ = try await w.tasks.deleteMarketTask(del, options: alice.options)
            await expectFailure(.notFound) { try await w.get(alice, t.taskId) }
            await expectFailure(.notFound) { try await w.tasks.deleteMarketTask(del, options: alice.options) }
            var delBid = Tasks_V1_DeleteBidRequest()
            delBid.bidId = b.bidId
            await expectFailure(.notFound) { try await w.tasks.deleteBid(delBid, options: bob.options) }
            #expect(await eventually { (try? await w.notifications(to: bob, kind: .bidDeclined).count) == 1 })
            let leftovers = try await w.core.read { c in
                try c.queryOne("SELECT (SELECT COUNT(*) FROM market_task_photos) + (SELECT COUNT(*) FROM market_bids)")!.get(0, as: Int64.self)
            }
            #expect(leftovers == 0)
        }
    }

    @Test func bidsAcceptDoneAndSettlementExactlyOnce() async throws {
        try await withWorld { w in
            let (alice, bob, dave, eve) = (try await w.user("alice"), try await w.user("bob"), try await w.user("dave"), try await w.user("eve"))
            let t = try await w.post(alice, newMarketTask("Walk my dog"))
            await expectFailure(.permissionDenied) { try await w.bid(alice, t.taskId, 100) }
            await expectFailure(.invalidArgument, fields: ["amount.amount_cents", "amount.currency"]) {
                try await w.tasks.placeBid(bidRequest(t.taskId, 0, "cad"), options: bob.options)
            }
            await expectFailure(.invalidArgument, fields: ["idempotency_key", "task_id", "amount"]) {
                try await w.tasks.placeBid(Tasks_V1_PlaceBidRequest(), options: bob.options)
            }
            await expectFailure(.notFound) { try await w.bid(bob, "01NOSUCHTASK0000000000000", 100) }

            // First bid → BIDDED; the requester is notified; a retry is answered, not repeated.
            let key = UUID().uuidString
            let first = try await w.tasks.placeBid(bidRequest(t.taskId, 6000, key: key), options: bob.options)
            #expect(first.taskStatus == .bidded && first.bid.status == .active && first.bid.provider.userId == bob.id && !first.replayed)
            #expect(try await w.tasks.placeBid(bidRequest(t.taskId, 6000, key: key), options: bob.options).replayed)
            // Bidding again replaces the amount under a new id: accepting the id one saw before the
            // change is NOT_FOUND, never the new amount (no bait-and-switch).
            let replaced = try await w.bid(bob, t.taskId, 4500)
            #expect(replaced.bidId != first.bid.bidId && replaced.amount.amountCents == 4500)
            await expectFailure(.notFound) { try await w.accept(alice, first.bid.bidId) }
            let daveBid = try await w.bid(dave, t.taskId, 6000)
            await expectFailure(.invalidArgument, fields: ["amount.currency"]) {
                try await w.tasks.placeBid(bidRequest(t.taskId, 100, "EUR"), options: eve.options)
            }
            let eveBid = try await w.bid(eve, t.taskId, 7000)
            #expect(await eventually { (try? await w.notifications(to: alice, kind: .newBid).count) == 4 })
            var detail = try await w.get(eve, t.taskId)
            #expect(detail.status == .bidded && detail.bidCount == 3 && detail.lowestBid.amountCents == 4500 && detail.lowestBid.currency == "CAD")

            // Bids: the requester sees all, lowest first; a bidder only their own.
            var lb = Tasks_V1_ListBidsRequest()
            lb.taskId = t.taskId
            lb.pageSize = 2
            let p1 = try await w.tasks.listBids(lb, options: alice.options)
            lb.pageToken = p1.nextPageToken
            let p2 = try await w.tasks.listBids(lb, options: alice.options)
            #expect((p1.bids + p2.bids).map(\.bidId) == [replaced.bidId, daveBid.bidId, eveBid.bidId] && p2.nextPageToken.isEmpty)
            lb.pageToken = ""
            #expect(try await w.tasks.listBids(lb, options: dave.options).bids.map(\.bidId) == [daveBid.bidId])
            lb.pageToken = p1.nextPageToken
            await expectFailure(.invalidArgument, fields: ["page_token"]) { try await w.tasks.listBids(lb, options: dave.options) }

            // Decline (requester only) and delete (own bid only).
            var decline = Tasks_V1_DeclineBidRequest()
            decline.bidId = eveBid.bidId
            await expectFailure(.permissionDenied) { try await w.tasks.declineBid(decline, options: bob.options) }
            #expect(try await w.tasks.declineBid(decline, options: alice.options).taskStatus == .bidded)
            #expect(await eventually { (try? await w.notifications(to: eve, kind: .bidDeclined).count) == 1 })
            var del = Tasks_V1_DeleteBidRequest()
            del.bidId = daveBid.bidId
            await expectFailure(.permissionDenied) { try await w.tasks.deleteBid(del, options: bob.options) }
            #expect(try await w.tasks.deleteBid(del, options: dave.options).taskStatus == .bidded)
            _ = try await w.bid(dave, t.taskId, 5000)
            let daveAgain = try await w.list(dave, .bidOnByMe)
            #expect(daveAgain.map(\.taskId) == [t.taskId])

            // Done before accepting: refused; a non-requester cannot accept.
            await expectFailure(.failedPrecondition) { try await w.done(alice, t.taskId) }
            await expectFailure(.permissionDenied) { try await w.accept(bob, replaced.bidId) }

            // Two accepts racing: exactly one wins, the other hears why.
            let daveCurrent = try await w.tasks.listBids(
                {
                    var r = Tasks_V1_ListBidsRequest(); r.taskId = t.taskId; return r
                }(), options: dave.options
            ).bids[0]
            async let a1 = attempt { try await w.accept(alice, replaced.bidId) }
            async let a2 = attempt { try await w.accept(alice, daveCurrent.bidId) }
            let results = [await a1, await a2]
            let wins = results.compactMap { try? $0.get() }
            #expect(wins.count == 1)
            for case .failure(let e) in results { #expect((e as? RPCError)?.code == .failedPrecondition, "\(e)") }
            let assigned = wins[0]
            #expect(assigned.status == .assigned && assigned.hasAcceptedBid && assigned.acceptedBid.status == .accepted)
            let winner = assigned.acceptedBid.provider.userId == bob.id ? bob : dave
            let loser = winner.id == bob.id ? dave : bob
            #expect(assigned.bidCount == 1)  // the other bid stays for a possible "not complete"
            #expect(await eventually { (try? await w.notifications(to: winner, kind: .bidAccepted).count) == 1 })

            // Assigned: hidden from ALL, visible to its people, not to others; bids frozen.
            #expect(try await w.list(eve, .all).isEmpty)
            #expect(try await w.list(winner, .assignedToMe).map(\.taskId) == [t.taskId])
            #expect(try await w.list(alice, .requestedByMe, [.assigned]).map(\.taskId) == [t.taskId])
            await expectFailure(.notFound) { try await w.get(eve, t.taskId) }
            detail = try await w.get(loser, t.taskId)
            #expect(detail.status == .assigned)
            await expectFailure(.failedPrecondition) { try await w.bid(loser, t.taskId, 10) }
            var edit = Tasks_V1_UpdateMarketTaskRequest()
            edit.taskId = t.taskId
            edit.title.value = "x"
            await expectFailure(.failedPrecondition) { try await w.tasks.updateMarketTask(edit, options: alice.options) }
            var delT = Tasks_V1_DeleteMarketTaskRequest()
            delT.taskId = t.taskId
            await expectFailure(.failedPrecondition) { try await w.tasks.deleteMarketTask(delT, options: alice.options) }
            var delAccepted = Tasks_V1_DeleteBidRequest()
            delAccepted.bidId = assigned.acceptedBid.bidId
            await expectFailure(.failedPrecondition) { try await w.tasks.deleteBid(delAccepted, options: winner.options) }

            // Done: only the requester; the settlement reaches finance once, also after a repeat
            // and while finance is down for a while.
            await expectFailure(.permissionDenied) { try await w.done(winner, t.taskId) }
            w.setFinanceDown(true)
            let done = try await w.done(alice, t.taskId)
            #expect(done.status == .done && done.hasDoneAt && done.acceptedBid.bidId == assigned.acceptedBid.bidId)
            #expect(try await w.done(alice, t.taskId) == done)  // unchanged
            // While finance refuses, the one settlement waits in tasks' outbox, tried and kept.
            let settlementEvent = "tasks:settlement:\(t.taskId)"
            #expect(await eventually { (try? await w.pendingSettlements().contains { $0.eventID == settlementEvent && $0.attempts >= 1 }) == true })
            try await Task.sleep(for: .milliseconds(300))
            #expect(try await w.pendingSettlements().map(\.eventID) == [settlementEvent])
            w.setFinanceDown(false)
            #expect(try await w.outboxDrained())
            // Finance recorded it once: one SETTLEMENT in the marketplace history of each side,
            // the requester owing the provider the accepted bid.
            let price = assigned.acceptedBid.amount.amountCents
            let mine = try await w.settlements(of: alice, with: winner)
            #expect(mine.count == 1, "\(mine)")
            let s = try #require(mine.first)
            #expect(s.kind == .settlement && s.taskId == t.taskId && s.description_p == "Walk my dog" && s.createdByUserId.isEmpty)
            #expect(s.amount.amountCents == -price && s.amount.currency == "CAD" && s.balanceAfter.amountCents == -price)
            let theirs = try await w.settlements(of: winner, with: alice)
            #expect(theirs.map(\.transactionId) == [s.transactionId] && theirs[0].amount.amountCents == price)
            #expect(try await w.settlements(of: alice, with: loser).isEmpty)
            let owed = try await w.marketBalances(of: alice)
            #expect(owed.map { [$0.counterpart.userId, $0.amount.currency] } == [[winner.id, "CAD"]] && owed[0].amount.amountCents == -price)
            // A repeat of the same settlement (as a redelivery would be) is finance's replay of it.
            var again = Finance_V1_RecordTaskSettlementRequest()
            again.idempotencyKey = settlementEvent
            again.taskId = t.taskId
            again.requesterUserId = alice.id
            again.providerUserId = winner.id
            again.amount = assigned.acceptedBid.amount
            again.description_p = "Walk my dog"
            let replay = try await w.financeInternal.recordTaskSettlement(again)
            #expect(replay.replayed && replay.transaction.transactionId == s.transactionId)
            #expect(try await w.settlements(of: alice, with: winner).count == 1)
            #expect(await eventually { (try? await w.notifications(to: winner, kind: .taskDone).count) == 1 })
            var nc = Tasks_V1_MarkMarketTaskNotCompleteRequest()
            nc.taskId = t.taskId
            await expectFailure(.failedPrecondition) { try await w.tasks.markMarketTaskNotComplete(nc, options: alice.options) }
        }
    }

    @Test func notCompleteReopensTheTask() async throws {
        try await withWorld { w in
            let (alice, bob, dave) = (try await w.user("alice"), try await w.user("bob"), try await w.user("dave"))
            let t = try await w.post(alice, newMarketTask("Paint fence"))
            let b = try await w.bid(bob, t.taskId, 1000)
            _ = try await w.bid(dave, t.taskId, 2000)
            _ = try await w.accept(alice, b.bidId)
            var nc = Tasks_V1_MarkMarketTaskNotCompleteRequest()
            nc.taskId = t.taskId
            await expectFailure(.permissionDenied) { try await w.tasks.markMarketTaskNotComplete(nc, options: bob.options) }
            let back = try await w.tasks.markMarketTaskNotComplete(nc, options: alice.options).task
            #expect(back.status == .bidded && back.bidCount == 1 && back.lowestBid.amountCents == 2000 && !back.hasAcceptedBid)
            await expectFailure(.failedPrecondition) { try await w.tasks.markMarketTaskNotComplete(nc, options: alice.options) }
            // The last bid goes: REQUESTED.
            let d2 = try await w.tasks.listBids(
                {
                    var r = Tasks_V1_ListBidsRequest(); r.taskId = t.taskId; return r
                }(), options: alice.options
            ).bids
            _ = try await w.accept(alice, d2[0].bidId)
            #expect(try await w.tasks.markMarketTaskNotComplete(nc, options: alice.options).task.status == .requested)
            // The provider whose bid was removed may bid again.
            #expect(try await w.tasks.placeBid(bidRequest(t.taskId, 900), options: bob.options).taskStatus == .bidded)
            var dec = Tasks_V1_DeclineBidRequest()
            dec.bidId = try await w.tasks.listBids(
                {
                    var r = Tasks_V1_ListBidsRequest(); r.taskId = t.taskId; return r
                }(), options: bob.options
            ).bids[0].bidId
            #expect(try await w.tasks.declineBid(dec, options: alice.options).taskStatus == .requested)
            await expectFailure(.notFound) { try await w.accept(alice, dec.bidId) }  // a declined bid is gone
        }
    }

    /// A hostile first bidder cannot lock a task's currency: made-up codes are refused, and once the
    /// requester declines a bid its provider cannot bid on that task again (in any currency).
    @Test func aHostileFirstBidderCannotLockTheCurrency() async throws {
        try await withWorld { w in
            let (alice, mallory, bob) = (try await w.user("alice"), try await w.user("mallory"), try await w.user("bob"))
            let t = try await w.post(alice, newMarketTask("Paint the fence"))
            // Three upper-case letters that are no ISO 4217 currency, and the X-codes, are refused.
            for code in ["ZZZ", "XXX", "XTS", "ABC"] {
                let f = await expectFailure(.invalidArgument, fields: ["amount.currency"]) {
                    try await w.tasks.placeBid(bidRequest(t.taskId, 100, code), options: mallory.options)
                }
                #expect(f?.message.contains(code) == true)
            }
            #expect(try await w.get(alice, t.taskId).status == .requested)
            // A real but odd currency fixes the task's currency for the others...
            let hostile = try await w.tasks.placeBid(bidRequest(t.taskId, 100, "KPW"), options: mallory.options).bid
            await expectFailure(.invalidArgument, fields: ["amount.currency"]) {
                try await w.tasks.placeBid(bidRequest(t.taskId, 5000, "CAD"), options: bob.options)
            }
            // ...until the requester declines it: the decliner's provider cannot come back, in any currency.
            var decline = Tasks_V1_DeclineBidRequest()
            decline.bidId = hostile.bidId
            #expect(try await w.tasks.declineBid(decline, options: alice.options).taskStatus == .requested)
            for code in ["KPW", "CAD"] {
                let f = await expectFailure(.failedPrecondition) {
                    try await w.tasks.placeBid(bidRequest(t.taskId, 90, code), options: mallory.options)
                }
                #expect(f?.message == "the requester declined your bid on this task")
            }
            let honest = try await w.tasks.placeBid(bidRequest(t.taskId, 5000, "CAD"), options: bob.options)
            #expect(honest.taskStatus == .bidded && honest.bid.amount.currency == "CAD")
            // Only this task: mallory may bid on another one; deleting one's own bid is no decline.
            let other = try await w.post(alice, newMarketTask("Mow the lawn"))
            let own = try await w.tasks.placeBid(bidRequest(other.taskId, 700, "EUR"), options: mallory.options).bid
            var del = Tasks_V1_DeleteBidRequest()
            del.bidId = own.bidId
            _ = try await w.tasks.deleteBid(del, options: mallory.options)
            #expect(try await w.tasks.placeBid(bidRequest(other.taskId, 800, "EUR"), options: mallory.options).taskStatus == .bidded)
            let declines = try await w.core.read { c in
                try c.query("SELECT task_id, provider_id FROM market_declined_bidders").map {
                    [try $0.get(0, as: String.self), try $0.get(1, as: String.self)]
                }
            }
            #expect(declines == [[t.taskId, mallory.id]])
        }
    }

    @Test func listsFilterAndPageInATotalOrder() async throws {
        try await withWorld { w in
            let (alice, bob) = (try await w.user("alice"), try await w.user("bob"))
            var ids: [String] = []
            for i in 0..<7 { ids.append(try await w.post(i % 2 == 0 ? alice : bob, newMarketTask("Task \(i)")).taskId) }
            _ = try await w.bid(bob, ids[0], 100)
            _ = try await w.bid(bob, ids[2], 100)
            let all = try await w.list(bob, .all, pageSize: 2)
            #expect(all.map(\.taskId) == ids.reversed())
            #expect(try await w.list(bob, .all, [.bidded]).map(\.taskId) == [ids[2], ids[0]])
            #expect(try await w.list(alice, .requestedByMe, pageSize: 3).map(\.taskId) == [ids[6], ids[4], ids[2], ids[0]])
            #expect(try await w.list(alice, .requestedByMe, [.bidded]).map(\.taskId) == [ids[2], ids[0]])
            #expect(try await w.list(bob, .bidOnByMe).map(\.taskId) == [ids[2], ids[0]])
            #expect(try await w.list(bob, .assignedToMe).isEmpty)
            var r = Tasks_V1_ListMarketTasksRequest()
            await expectFailure(.invalidArgument, fields: ["scope"]) { try await w.tasks.listMarketTasks(r, options: bob.options) }
            r.scope = .all
            r.statuses = [.done, .unspecified]
            r.pageSize = -1
            await expectFailure(.invalidArgument, fields: ["statuses[0]", "statuses[1]", "page_size"]) {
                try await w.tasks.listMarketTasks(r, options: bob.options)
            }
            r.statuses = []
            r.pageSize = 2
            r.pageToken = try await w.tasks.listMarketTasks(r, options: bob.options).nextPageToken
            r.scope = .requestedByMe
            await expectFailure(.invalidArgument, fields: ["page_token"]) { try await w.tasks.listMarketTasks(r, options: bob.options) }
        }
    }

    @Test func searchFindsEveryKeywordByDistanceAndMatchesAFullScan() async throws {
        try await withWorld { w in
            let (alice, bob) = (try await w.user("alice"), try await w.user("bob"))
            let here = point(53.5444, -113.4909)
            let near = try await w.post(alice, newMarketTask("Assemble IKEA desk", description: "MALM, tools on site", at: point(53.5232, -113.5263)))
            let nearer = try await w.post(alice, newMarketTask("Desk to assemble", at: point(53.5450, -113.4900)))
            _ = try await w.post(alice, newMarketTask("Assemble a desk", at: point(51.0447, -114.0719)))  // Calgary: 280 km
            _ = try await w.post(alice, newMarketTask("Desk only", at: point(53.5440, -113.4910)))  // one keyword missing
            _ = try await w.post(alice, newMarketTask("Assemble desk, no place"))
            let bidded = try await w.post(bob, newMarketTask("ASSEMBLE my DESK", description: "ünïcode", at: point(53.60, -113.50)))
            _ = try await w.bid(alice, bidded.taskId, 100)

            var s = Tasks_V1_SearchMarketTasksRequest()
            s.keywords = "desk assemble"
            s.near = here
            s.maxDistanceKm.value = 10
            let r = try await w.tasks.searchMarketTasks(s, options: bob.options)
            #expect(r.results.map(\.task.taskId) == [nearer.taskId, near.taskId, bidded.taskId])
            let expected = Geo.distanceKm(GeoPoint(latitude: 53.5444, longitude: -113.4909), GeoPoint(latitude: 53.5232, longitude: -113.5263))
            #expect(abs(r.results[1].distanceKm.value - expected) < 1e-9)
            s.statuses = [.bidded]
            #expect(try await w.tasks.searchMarketTasks(s, options: bob.options).results.map(\.task.taskId) == [bidded.taskId])
            s.statuses = []
            // Substrings, any case; short words too.
            s.keywords = "SEMB es"
            #expect(try await w.tasks.searchMarketTasks(s, options: bob.options).results.count == 3)
            // Without a point: newest first, tasks without a place included, no distances.
            var all = Tasks_V1_SearchMarketTasksRequest()
            all.keywords = "assemble desk"
            let flat = try await w.tasks.searchMarketTasks(all, options: bob.options).results
            #expect(flat.count == 5 && flat.allSatisfy { !$0.hasDistanceKm } && flat[0].task.taskId == bidded.taskId)
            // Assigned tasks leave the search.
            let b = try await w.tasks.listBids(
                {
                    var l = Tasks_V1_ListBidsRequest(); l.taskId = bidded.taskId; return l
                }(), options: bob.options
            ).bids[0]
            _ = try await w.accept(bob, b.bidId)
            #expect(try await w.tasks.searchMarketTasks(all, options: bob.options).results.count == 4)

            // Errors, all named at once.
            var bad = Tasks_V1_SearchMarketTasksRequest()
            bad.keywords = (0..<11).map { "w\($0)" }.joined(separator: " ")
            bad.statuses = [.assigned]
            bad.maxDistanceKm.value = 0
            bad.pageSize = -3
            await expectFailure(.invalidArgument, fields: ["keywords", "statuses[0]", "max_distance_km", "max_distance_km", "page_size"]) {
                try await w.tasks.searchMarketTasks(bad, options: bob.options)
            }
            var far = Tasks_V1_SearchMarketTasksRequest()
            far.near = point(0, 0)
            far.maxDistanceKm.value = 20001
            await expectFailure(.invalidArgument, fields: ["max_distance_km"]) { try await w.tasks.searchMarketTasks(far, options: bob.options) }
        }
    }

    /// Random tasks everywhere, the antimeridian and the poles included: the indexes answer
    /// exactly what the full scan answers, page by page.
    @Test func theIndexesAgreeWithAFullScanEverywhere() async throws {
        try await withWorld { w in
            let alice = try await w.user("alice")
            let centers = [(0.0, 179.98), (89.97, 45.0), (-89.99, 0.0), (53.54, -113.49), (-16.5, -179.99)]
            var rng = SystemRandomNumberGenerator()
            let words = ["desk", "garden", "dog", "paint", "move"]
            var rows: [(String, Double, Double, String)] = []
            for (lat, lon) in centers {
                for _ in 0..<40 {
                    let la = max(-90, min(90, lat + Double.random(in: -0.1...0.1, using: &rng)))
                    var lo = lon + Double.random(in: -0.2...0.2, using: &rng) / max(0.01, cos(la * .pi / 180))
                    while lo > 180 { lo -= 360 }
                    while lo < -180 { lo += 360 }
                    lo = max(-180, min(180, lo))
                    rows.append((words.randomElement(using: &rng)! + " " + words.randomElement(using: &rng)!, la, lo, ""))
                }
            }
            for (title, la, lo, _) in rows { _ = try await w.post(alice, newMarketTask(title, at: point(la, lo))) }
            for (lat, lon) in centers {
                for radius in [3.0, 8.0, 15.0, 30.0] {
                    for kw in [[], ["desk"], ["de", "paint"], ["og"]] {
                        let q = MarketSearch.Query(words: kw, statuses: [1, 2], near: GeoPoint(latitude: lat, longitude: lon), radiusKm: radius)
                        let indexed = try await pages(w.core, q, useIndexes: true)
                        let scanned = try await pages(w.core, q, useIndexes: false)
                        #expect(indexed.map(\.id) == scanned.map(\.id), "\(lat),\(lon) r=\(radius) \(kw)")
                        #expect(zip(indexed, scanned).allSatisfy { $0.distance == $1.distance })
                        #expect(indexed.allSatisfy { ($0.distance ?? .infinity) <= radius })
                    }
                }
            }
        }
    }

    /// A circle over the whole Earth (the contract's 20,000 km) holding more places than
    /// `MarketSearch.boxCandidatesReadHere`: SQLite orders them and returns one page; every page
    /// equals the full scan's, in the total order (distance, then newest).
    @Test func aHugeCircleAnswersOnePageOrderedInSQL() async throws {
        try await withWorld { w in
            let alice = try await w.user("alice")
            let words = ["desk", "garden", "dog", "paint", "move"]
            let count = MarketSearch.boxCandidatesReadHere + 1_000
            let base = w.clock.nowMilliseconds()
            try await w.core.write { tx in
                var rng = SystemRandomNumberGenerator()
                for i in 0..<count {
                    // Half on 40 points around Edmonton (many equal distances: ties go newest first),
                    // half anywhere; one in twenty assigned (out of the search).
                    let (la, lo) =
                        i % 2 == 0
                        ? (53.5 + Double(i % 40) * 0.01, -113.5)
                        : (Double.random(in: -90...90, using: &rng), Double.random(in: -180...180, using: &rng))
                    let title = words[i % 5] + " " + words[(i / 5) % 5]
                    try tx.execute(
                        """
                        INSERT INTO market_tasks (id, requester_id, title, description, title_folded, latitude, longitude, status, created_at,
                            updated_at)
                        VALUES (?, ?, ?, '', ?, ?, ?, ?, ?, ?)
                        """, ULID.make(now: base + Int64(i)), alice.id, title, TextFold.fold(title), la, lo, Int64(i % 20 == 7 ? 3 : 1),
                        base + Int64(i),
                        base + Int64(i))
                }
            }
            for (lat, lon) in [(53.54, -113.49), (0.0, 0.0), (-89.9, 170.0)] {
                let centre = GeoPoint(latitude: lat, longitude: lon)
                for kw in [[], ["desk"], ["de", "paint"], ["og"]] {
                    let q = MarketSearch.Query(words: kw, statuses: [1, 2], near: centre, radiusKm: 20_000)
                    let plan = try await w.core.read { c in try MarketSearch.circlePlan(c, q, near: centre, radius: 20_000) }
                    #expect(plan == .nearestInSQL(narrowedByWords: false))
                    let indexed = try await firstPages(w.core, q, useIndexes: true, pages: 3, limit: 40)
                    let scanned = try await firstPages(w.core, q, useIndexes: false, pages: 3, limit: 40)
                    #expect(indexed.count == 120 && indexed.map(\.id) == scanned.map(\.id), "\(lat),\(lon) \(kw)")
                    #expect(zip(indexed, scanned).allSatisfy { $0.distance == $1.distance })
                    #expect(
                        zip(indexed, indexed.dropFirst()).allSatisfy { a, b in
                            a.distance! < b.distance! || (a.distance! == b.distance! && a.id > b.id)
                        })
                }
            }
            // Over gRPC: the contract's largest radius answers a page and its next page.
            var s = Tasks_V1_SearchMarketTasksRequest()
            s.near = point(53.54, -113.49)
            s.maxDistanceKm.value = 20_000
            s.keywords = "desk"
            s.pageSize = 25
            let first = try await w.tasks.searchMarketTasks(s, options: alice.options)
            s.pageToken = first.nextPageToken
            let second = try await w.tasks.searchMarketTasks(s, options: alice.options)
            let q = MarketSearch.Query(words: ["desk"], statuses: [1, 2], near: GeoPoint(latitude: 53.54, longitude: -113.49), radiusKm: 20_000)
            let reference = try await firstPages(w.core, q, useIndexes: false, pages: 1, limit: 50)
            #expect((first.results + second.results).map(\.task.taskId) == reference.map(\.id))
            #expect((first.results + second.results).map(\.distanceKm.value) == reference.map(\.distance!))
        }
    }

    func firstPages(_ core: TasksCore, _ q: MarketSearch.Query, useIndexes: Bool, pages: Int, limit: Int) async throws -> [MarketSearch.Hit] {
        var out: [MarketSearch.Hit] = []
        var cursor: [String]?
        for _ in 0..<pages {
            let after = cursor
            let (hits, more) = try await core.read { c in try MarketSearch.run(c, q, after: after, limit: limit, useIndexes: useIndexes) }
            out += hits
            guard more else { break }
            cursor = hits.last?.cursor
        }
        return out
    }

    func pages(_ core: TasksCore, _ q: MarketSearch.Query, useIndexes: Bool) async throws -> [MarketSearch.Hit] {
        var out: [MarketSearch.Hit] = []
        var cursor: [String]?
        repeat {
            let after = cursor
            let (hits, more) = try await core.read { c in try MarketSearch.run(c, q, after: after, limit: 7, useIndexes: useIndexes) }
            out += hits
            cursor = more ? hits.last?.cursor : nil
        } while cursor != nil
        return out
    }

    @Test func requestsOverTheMethodsLimitsAreRefusedFromTheirLength() async throws {
        try await withWorld { w in
            let alice = try await w.user("alice")
            // Six photos of 256 KiB: over CreateMarketTask's 1,327,104 bytes.
            let big = [0xFF, 0xD8, 0xFF] + [UInt8](repeating: 1, count: 262_141)
            await expectFailure(.resourceExhausted) {
                try await w.tasks.createMarketTask(newMarketTask(photos: Array(repeating: big, count: 6)), options: alice.options)
            }
            // Five fit the method and the field rules.
            let five = try await w.post(alice, newMarketTask(photos: Array(repeating: big, count: 5)))
            #expect(five.photos.count == 5 && five.photos.allSatisfy { $0.sizeBytes == 262_144 })
            // A habit photo over CreateHabitEvent's 73,728 bytes; one of 65,536 within it is named.
            let h = try await w.habit(alice, newHabit(days: [.monday, .tuesday, .wednesday, .thursday, .friday, .saturday, .sunday], zone: "UTC"))
            await expectFailure(.resourceExhausted) {
                try await w.event(alice, newEvent(h.habitId, photo: [0xFF, 0xD8, 0xFF] + [UInt8](repeating: 0, count: 80_000), zone: "UTC"))
            }
            await expectFailure(.invalidArgument, fields: ["photo"]) {
                try await w.event(alice, newEvent(h.habitId, photo: [0xFF, 0xD8, 0xFF] + [UInt8](repeating: 0, count: 65_533), zone: "UTC"))
            }
            #expect(
                try await w.event(alice, newEvent(h.habitId, photo: [0xFF, 0xD8, 0xFF] + [UInt8](repeating: 0, count: 65_532), zone: "UTC"))
                    .photoSizeBytes == 65_535)
        }
    }

    @Test func erasingAUserWithdrawsTheirRequestsAndBidsAndKeepsDoneTasksAnonymised() async throws {
        try await withWorld { w in
            let (alice, bob, dave) = (try await w.user("alice"), try await w.user("bob"), try await w.user("dave"))
            let open = try await w.post(alice, newMarketTask("Open one"))
            _ = try await w.bid(bob, open.taskId, 100)
            let assigned = try await w.post(alice, newMarketTask("Assigned one"))
            _ = try await w.accept(alice, try await w.bid(bob, assigned.taskId, 200).bidId)
            let done = try await w.post(alice, newMarketTask("Done one"))
            _ = try await w.accept(alice, try await w.bid(bob, done.taskId, 300).bidId)
            _ = try await w.done(alice, done.taskId)
            let daves = try await w.post(dave, newMarketTask("Dave's"))
            _ = try await w.bid(alice, daves.taskId, 50)
            let davesAssigned = try await w.post(dave, newMarketTask("Dave's assigned"))
            _ = try await w.bid(bob, davesAssigned.taskId, 70)
            _ = try await w.accept(dave, try await w.bid(alice, davesAssigned.taskId, 60).bidId)
            #expect(try await w.outboxDrained())

            var e = Tasks_V1_EraseUserRequest()
            e.eventId = "evt-erase-alice"
            e.userId = alice.id
            #expect(try await w.internalAPI.eraseUser(e).replayed == false)
            #expect(try await w.internalAPI.eraseUser(e).replayed == true)
            await expectFailure(.notFound) { try await w.get(bob, open.taskId) }
            await expectFailure(.notFound) { try await w.get(bob, assigned.taskId) }
            let kept = try await w.get(bob, done.taskId)
            #expect(kept.status == .done && kept.requester.userId.isEmpty && kept.requester.username == "deleted-user")
            #expect(kept.acceptedBid.provider.userId == bob.id)
            let d = try await w.get(dave, daves.taskId)
            #expect(d.status == .requested && d.bidCount == 0)
            // Dave's task assigned to alice stays ASSIGNED, her accepted bid kept, anonymised.
            let da = try await w.get(dave, davesAssigned.taskId)
            #expect(da.status == .assigned && da.bidCount == 1 && da.acceptedBid.amount.amountCents == 60)
            #expect(da.acceptedBid.provider.userId.isEmpty && da.acceptedBid.provider.username == "deleted-user")
            #expect(try await w.outboxDrained())
            // Settlements are finance's, untouched: bob's history with alice keeps the done task's.
            #expect(try await w.settlements(of: bob, with: alice).map(\.taskId) == [done.taskId])
            #expect(await eventually { (try? await w.notifications(to: bob, kind: .bidDeclined).count) == 2 })  // alice's two withdrawn tasks
        }
    }

    @Test func erasingTheProviderOfAnAssignedTaskKeepsTheAcceptedBidAnonymisedAndTheTaskAssigned() async throws {
        try await withWorld { w in
            let (alice, bob, carol) = (try await w.user("alice"), try await w.user("bob"), try await w.user("carol"))
            // Three of alice's tasks assigned to bob; carol bids on two of them too.
            let fence = try await w.post(alice, newMarketTask("Paint the fence"))
            _ = try await w.bid(carol, fence.taskId, 900)
            let fenceBid = try await w.bid(bob, fence.taskId, 800)
            _ = try await w.accept(alice, fenceBid.bidId)
            let lawn = try await w.post(alice, newMarketTask("Mow the lawn"))
            let carolLawn = try await w.bid(carol, lawn.taskId, 500)
            _ = try await w.accept(alice, try await w.bid(bob, lawn.taskId, 400).bidId)
            let sink = try await w.post(alice, newMarketTask("Fix the sink"))
            let sinkBid = try await w.bid(bob, sink.taskId, 300)
            _ = try await w.accept(alice, sinkBid.bidId)
            #expect(try await w.outboxDrained())

            var e = Tasks_V1_EraseUserRequest()
            e.eventId = "evt-erase-bob"
            e.userId = bob.id
            #expect(try await w.internalAPI.eraseUser(e).replayed == false)

            // Kept: ASSIGNED, the accepted bid (same id and amount) shown with a deleted user.
            func anonymised(_ b: Tasks_V1_Bid) -> Bool {
                b.status == .accepted && b.provider.userId.isEmpty && b.provider.username == "deleted-user"
            }
            let f = try await w.get(alice, fence.taskId)
            #expect(f.status == .assigned && f.acceptedBid.bidId == fenceBid.bidId && f.acceptedBid.amount.amountCents == 800)
            #expect(anonymised(f.acceptedBid) && f.bidCount == 1 && f.lowestBid.amountCents == 900)
            let s = try await w.get(alice, sink.taskId)
            #expect(s.status == .assigned && s.acceptedBid.bidId == sinkBid.bidId && anonymised(s.acceptedBid) && s.bidCount == 0)
            var lb = Tasks_V1_ListBidsRequest()
            lb.taskId = fence.taskId
            let bids = try await w.tasks.listBids(lb, options: alice.options).bids
            #expect(bids.map(\.amount.amountCents) == [800, 900] && anonymised(bids[0]) && bids[1].provider.userId == carol.id)
            // The lists show it anonymised too; the other bidder still sees the task.
            let mine = try await w.list(alice, .requestedByMe, [.assigned])
            #expect(mine.map(\.taskId) == [sink.taskId, lawn.taskId, fence.taskId] && mine.allSatisfy { anonymised($0.acceptedBid) })
            let carols = try await w.list(carol, .bidOnByMe)
            #expect(
                carols.map(\.taskId) == [lawn.taskId, fence.taskId] && carols.allSatisfy { $0.status == .assigned && anonymised($0.acceptedBid) })
            // Nothing points at bob any more: not his to see or list.
            #expect(try await w.list(bob, .assignedToMe).isEmpty)
            #expect(try await w.list(bob, .bidOnByMe).isEmpty)
            await expectFailure(.notFound) { try await w.get(bob, fence.taskId) }

            // A repeated event changes nothing.
            func all() async throws -> [Tasks_V1_MarketTask] {
                [try await w.get(alice, fence.taskId), try await w.get(alice, lawn.taskId), try await w.get(alice, sink.taskId)]
            }
            let before = try await all()
            #expect(try await w.internalAPI.eraseUser(e).replayed == true)
            #expect(try await all() == before)

            // Done: DONE and kept, with no settlement (no creditor is left) and nobody told.
            let done = try await w.done(alice, fence.taskId)
            #expect(done.status == .done && done.hasDoneAt && done.acceptedBid.bidId == fenceBid.bidId && anonymised(done.acceptedBid))
            #expect(try await w.done(alice, fence.taskId) == done)  // unchanged
            #expect(try await w.outboxDrained())
            #expect(try await w.pendingSettlements().isEmpty)
            #expect(try await w.settlements(of: alice, with: bob).isEmpty)
            #expect(try await w.marketBalances(of: alice).isEmpty)
            #expect(try await w.notifications(to: bob, kind: .taskDone).isEmpty)
            #expect(try await w.list(carol, .bidOnByMe, [.done]).map(\.taskId) == [fence.taskId])

            // Not complete: reopened with the other bids, which the requester can then accept.
            var nc = Tasks_V1_MarkMarketTaskNotCompleteRequest()
            nc.taskId = lawn.taskId
            let reopened = try await w.tasks.markMarketTaskNotComplete(nc, options: alice.options).task
            #expect(reopened.status == .bidded && reopened.bidCount == 1 && !reopened.hasAcceptedBid)
            let toCarol = try await w.accept(alice, carolLawn.bidId)
            #expect(toCarol.status == .assigned && toCarol.acceptedBid.provider.userId == carol.id)

            // Delete: refused while ASSIGNED (as for every assigned task); after "not complete", allowed.
            var del = Tasks_V1_DeleteMarketTaskRequest()
            del.taskId = sink.taskId
            await expectFailure(.failedPrecondition) { try await w.tasks.deleteMarketTask(del, options: alice.options) }
            nc.taskId = sink.taskId
            #expect(try await w.tasks.markMarketTaskNotComplete(nc, options: alice.options).task.status == .requested)
            _ = try await w.tasks.deleteMarketTask(del, options: alice.options)
            await expectFailure(.notFound) { try await w.get(alice, sink.taskId) }
            #expect(try await w.outboxDrained())
            #expect(try await w.notifications(to: bob, kind: .bidDeclined).isEmpty)  // bob's account is gone: nobody to tell
        }
    }
}
