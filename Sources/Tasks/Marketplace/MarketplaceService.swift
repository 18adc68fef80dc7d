import Contracts
import Foundation
import RPCCore
import ServiceKit
import Storage

/// The marketplace (seed D), `tasks.v1.Tasks` marketplace RPCs: tasks with photos, lists, search,
/// bids, and "done" with its settlement in finance (through the outbox, once per task).
extension TasksService {
    static let marketTaskNotFound = "no such marketplace task (or it is not visible to you)"

    static func marketTaskID(_ raw: String, field: String = "task_id") throws -> String {
        var errors = FieldErrors()
        let id = FieldRules.id(raw, field: field, into: &errors)
        try errors.throwIfAny()
        return id
    }

    /// The task if `me` may read it (NOT_FOUND otherwise).
    static func visibleTask(_ db: some SQLReader, id: String, me: String) throws -> MarketStore.Row {
        guard let t = try MarketStore.one(db, id: id), try MarketStore.visible(db, t, to: me) else {
            throw RPCError(.notFound, marketTaskNotFound)
        }
        return t
    }

    /// The task for a change only its requester may make.
    static func ownTask(_ db: some SQLReader, id: String, me: String, what: String) throws -> MarketStore.Row {
        let t = try visibleTask(db, id: id, me: me)
        guard t.requesterID == me else { throw RPCError(.permissionDenied, "only the task's requester can \(what)") }
        return t
    }

    /// Messages of `rows` with the kept names (stale ones refreshed in the background).
    func marketMessages(_ rows: [MarketStore.Row]) async throws -> [Tasks_V1_MarketTask] {
        let staleBefore = core.users.staleBefore
        let ids = MarketStore.userIDs(rows)
        let users = try await core.read { c in try UserDirectory.cached(c, ids, staleBefore: staleBefore) }
        core.users.refreshIfStale(users.stale)
        return rows.map { MarketStore.proto($0, users: users.refs) }
    }

    static func marketMessage(_ tx: some SQLReader, id: String) throws -> Tasks_V1_MarketTask {
        guard let t = try MarketStore.one(tx, id: id) else { throw RPCError(.notFound, marketTaskNotFound) }
        return MarketStore.proto(t, users: try UserDirectory.cached(tx, MarketStore.userIDs([t])))
    }

    static func insertPhotos(_ tx: Transaction, task: String, photos: [[UInt8]], types: [String]) throws {
        guard !photos.isEmpty else { return }
        let row = try tx.queryOne("SELECT next_photo FROM market_tasks WHERE id = ?", task)
        var next = try row?.get(0, as: Int64.self) ?? 1
        let position =
            try tx.queryOne("SELECT COALESCE(MAX(position), 0) FROM market_task_photos WHERE task_id = ?", task)?.get(0, as: Int64.self) ?? 0
        for (i, p) in photos.enumerated() {
            try tx.execute(
                "INSERT INTO market_task_photos (task_id, photo_id, position, content_type, size_bytes, data) VALUES (?, ?, ?, ?, ?, ?)", task,
                "ph_\(next)", position + Int64(i) + 1, types[i], Int64(p.count), p)
            next += 1
        }
        try tx.execute("UPDATE market_tasks SET next_photo = ? WHERE id = ?", next, task)
    }

    // MARK: Tasks

    public func createMarketTask(request: Tasks_V1_CreateMarketTaskRequest, context: ServerContext) async throws -> Tasks_V1_CreateMarketTaskResponse
    {
        let me = try core.caller(context)
        var errors = FieldErrors()
        let key = FieldRules.idempotencyKey(request.idempotencyKey, into: &errors)
        let title = FieldRules.text(request.title, field: "title", 1...30, into: &errors)
        let description = FieldRules.text(request.description_p, field: "description", 0...300, multiline: true, into: &errors)
        let location = request.hasLocation ? Geo.point(request.location, field: "location", into: &errors) : nil
        if request.photos.count > MarketRules.maxPhotos { errors.add("photos", "at most \(MarketRules.maxPhotos) photos") }
        let types = MarketRules.photos(request.photos.map { Array($0) }, field: "photos", into: &errors)
        try errors.throwIfAny()

        let scope = "CreateMarketTask:\(me)", fingerprint = Idempotency.fingerprint(request)
        if var replay = try await core.store.storedAnswer(
            scope: scope, key: key, fingerprint: fingerprint, as: Tasks_V1_CreateMarketTaskResponse.self)
        {
            replay.replayed = true
            return replay
        }
        let users = try await core.users.lookUp([me])
        let now = core.now
        let photos = request.photos.map { Array($0) }
        let (response, replayed) = try await core.write { tx in
            try tx.idempotent(scope: scope, key: key, fingerprint: fingerprint, now: now) {
                let id = ULID.make(now: now)
                try tx.execute(
                    """
                    INSERT INTO market_tasks (id, requester_id, title, description, title_folded, description_folded, latitude, longitude, status,
                        created_at, updated_at)
                    VALUES (?, ?, ?, ?, ?, ?, ?, ?, 1, ?, ?)
                    """, id, me, title, description, TextFold.fold(title), TextFold.fold(description), location?.latitude, location?.longitude, now,
                    now)
                try Self.insertPhotos(tx, task: id, photos: photos, types: types.compactMap { $0 })
                try UserDirectory.remember(tx, users.values, now: now)
                var out = Tasks_V1_CreateMarketTaskResponse()
                out.task = try Self.marketMessage(tx, id: id)
                return out
            }
        }
        var out = response
        out.replayed = replayed
        return out
    }

    public func getMarketTask(request: Tasks_V1_GetMarketTaskRequest, context: ServerContext) async throws -> Tasks_V1_GetMarketTaskResponse {
        let me = try core.caller(context)
        let id = try Self.marketTaskID(request.taskId)
        let t = try await core.read { c in try Self.visibleTask(c, id: id, me: me) }
        var response = Tasks_V1_GetMarketTaskResponse()
        response.task = try await marketMessages([t])[0]
        return response
    }

    public func getMarketTaskPhoto(
        request: Tasks_V1_GetMarketTaskPhotoRequest, context: ServerContext
    ) async throws -> Tasks_V1_GetMarketTaskPhotoResponse {
        let me = try core.caller(context)
        var errors = FieldErrors()
        let id = FieldRules.id(request.taskId, field: "task_id", into: &errors)
        let photo = FieldRules.id(request.photoId, field: "photo_id", into: &errors)
        try errors.throwIfAny()
        return try await core.read { c in
            _ = try Self.visibleTask(c, id: id, me: me)
            guard
                let r = try c.queryOne(
                    "SELECT photo_id, content_type, size_bytes, data FROM market_task_photos WHERE task_id = ? AND photo_id = ?", id, photo)
            else { throw RPCError(.notFound, "this task has no photo \(photo)") }
            var response = Tasks_V1_GetMarketTaskPhotoResponse()
            response.photo.photoId = try r.get("photo_id")
            response.photo.contentType = try r.get("content_type")
            response.photo.sizeBytes = try r.get("size_bytes")
            response.data = try r.get("data", as: [UInt8].self)
            return response
        }
    }

    public func updateMarketTask(request: Tasks_V1_UpdateMarketTaskRequest, context: ServerContext) async throws -> Tasks_V1_UpdateMarketTaskResponse
    {
        let me = try core.caller(context)
        var errors = FieldErrors()
        let id = FieldRules.id(request.taskId, field: "task_id", into: &errors)
        let title = request.hasTitle ? FieldRules.text(request.title.value, field: "title", 1...30, into: &errors) : nil
        let description =
            request.hasDescription_p
            ? FieldRules.text(request.description_p.value, field: "description", 0...300, multiline: true, into: &errors) : nil
        var newLocation: GeoPoint?? = nil
        if request.hasLocation {
            newLocation = .some(request.location.hasLocation ? Geo.point(request.location.location, field: "location.location", into: &errors) : nil)
        }
        let location = newLocation
        if request.addPhotos.count > MarketRules.maxPhotos { errors.add("add_photos", "at most \(MarketRules.maxPhotos) photos") }
        let types = MarketRules.photos(request.addPhotos.map { Array($0) }, field: "add_photos", into: &errors)
        let remove = FieldRules.ids(request.removePhotoIds, field: "remove_photo_ids", minimum: 0, maximum: 5, into: &errors)
        try errors.throwIfAny()
        let now = core.now
        let photos = request.addPhotos.map { Array($0) }
        let task = try await core.write { tx -> MarketStore.Row in
            let t = try Self.ownTask(tx, id: id, me: me, what: "edit it")
            guard t.status.isOpen else {
                throw RPCError(.failedPrecondition, "the task is \(t.status == .done ? "done" : "assigned"): it can no longer be edited")
            }
            var missing = FieldErrors()
            for (i, p) in request.removePhotoIds.enumerated() where !t.photos.contains(where: { $0.id == FieldRules.trimmed(p) }) {
                missing.add("remove_photo_ids[\(i)]", "this task has no such photo")
            }
            try missing.throwIfAny(.notFound, summary: "not found")
            let kept = t.photos.count - remove.count
            if kept + photos.count > MarketRules.maxPhotos {
                throw FieldErrors.single(
                    .invalidArgument, field: "add_photos",
                    "a task has at most \(MarketRules.maxPhotos) photos (it would have \(kept + photos.count))")
            }
            for p in remove { try tx.execute("DELETE FROM market_task_photos WHERE task_id = ? AND photo_id = ?", id, p) }
            try Self.insertPhotos(tx, task: id, photos: photos, types: types.compactMap { $0 })
            if let title { try tx.execute("UPDATE market_tasks SET title = ?, title_folded = ? WHERE id = ?", title, TextFold.fold(title), id) }
            if let description {
                try tx.execute(
                    "UPDATE market_tasks SET description = ?, description_folded = ? WHERE id = ?", description, TextFold.fold(description), id)
            }
            if let location {
                try tx.execute("UPDATE market_tasks SET latitude = ?, longitude = ? WHERE id = ?", location?.latitude, location?.longitude, id)
            }
            try tx.execute("UPDATE market_tasks SET updated_at = ? WHERE id = ?", now, id)
            guard let after = try MarketStore.one(tx, id: id) else { throw RPCError(.notFound, Self.marketTaskNotFound) }
            return after
        }
        var response = Tasks_V1_UpdateMarketTaskResponse()
        response.task = try await marketMessages([task])[0]
        return response
    }

    public func deleteMarketTask(request: Tasks_V1_DeleteMarketTaskRequest, context: ServerContext) async throws -> Tasks_V1_DeleteMarketTaskResponse
    {
        let me = try core.caller(context)
        let id = try Self.marketTaskID(request.taskId)
        let core = self.core
        try await core.write { tx in
            let t = try Self.ownTask(tx, id: id, me: me, what: "delete it")
            guard t.status.isOpen else {
                throw RPCError(.failedPrecondition, "the task is \(t.status == .done ? "done" : "assigned"): it can no longer be deleted")
            }
            try Self.withdraw(core, tx, t, actor: me, reason: "The requester deleted the task")
        }
        return Tasks_V1_DeleteMarketTaskResponse()
    }

    /// Deletes an open or assigned task (its photos and bids with it), telling every bidder.
    static func withdraw(_ core: TasksCore, _ tx: Transaction, _ t: MarketStore.Row, actor: String?, reason: String) throws {
        let bidders = try tx.query("SELECT provider_id FROM market_bids WHERE task_id = ? AND provider_id IS NOT NULL", t.id).map {
            try $0.get(0, as: String.self)
        }
        try tx.execute("DELETE FROM market_tasks WHERE id = ?", t.id)
        try core.notify(
            tx, kind: .bidDeclined, recipients: bidders, actor: actor ?? "", title: "Task withdrawn: \(t.title)",
            body: "\(reason): your bid on \"\(t.title)\" is closed.", target: .taskId(t.id), data: ["task_id": t.id, "area": "marketplace"],
            eventID: "tasks:market-withdrawn:\(t.id)")
    }

    // MARK: Lists

    public func listMarketTasks(request: Tasks_V1_ListMarketTasksRequest, context: ServerContext) async throws -> Tasks_V1_ListMarketTasksResponse {
        let me = try core.caller(context)
        var errors = FieldErrors()
        let pageSize = FieldRules.pageSize(request.pageSize, defaultSize: 20, into: &errors)
        var statuses: [Int64] = []
        var condition = ""
        var args: [DatabaseValue] = []
        switch request.scope {
        case .all:
            statuses = MarketRules.statuses(
                request.statuses, allowed: [1, 2], defaults: [1, 2], what: "scope ALL lists open tasks: REQUESTED or BIDDED", into: &errors)
        case .requestedByMe:
            statuses = MarketRules.statuses(request.statuses, allowed: [1, 2, 3, 4], defaults: [1, 2, 3, 4], what: "unknown status", into: &errors)
            condition = " AND requester_id = ?"
            args = [.text(me)]
        case .bidOnByMe:
            statuses = MarketRules.statuses(request.statuses, allowed: [1, 2, 3, 4], defaults: [1, 2, 3, 4], what: "unknown status", into: &errors)
            condition = " AND id IN (SELECT task_id FROM market_bids WHERE provider_id = ?)"
            args = [.text(me)]
        case .assignedToMe:
            statuses = MarketRules.statuses(
                request.statuses, allowed: [3, 4], defaults: [3, 4], what: "scope ASSIGNED_TO_ME lists ASSIGNED and DONE tasks", into: &errors)
            condition = " AND assignee_id = ?"
            args = [.text(me)]
        default:
            errors.add("scope", "required: ALL, REQUESTED_BY_ME, BID_ON_BY_ME or ASSIGNED_TO_ME")
        }
        let filters = "market-list:\(request.scope.rawValue):\(statuses):\(me)"
        let cursor = core.pageTokens.cursor(request.pageToken, filters: filters, parts: 1, into: &errors)
        try errors.throwIfAny()
        let marks = statuses.map { _ in "?" }.joined(separator: ",")
        var sql = "SELECT id FROM market_tasks WHERE status IN (\(marks))\(condition)"
        args = statuses.map { .integer($0) } + args
        if let cursor {
            sql += " AND id < ?"
            args.append(.text(cursor[0]))
        }
        sql += " ORDER BY id DESC LIMIT ?"
        args.append(.integer(Int64(pageSize + 1)))
        let finalSQL = sql, finalArgs = args
        let (rows, more) = try await core.read { c -> ([MarketStore.Row], Bool) in
            let ids = try c.query(finalSQL, arguments: finalArgs).map { try $0.get(0, as: String.self) }
            return (try MarketStore.load(c, ids: Array(ids.prefix(pageSize))), ids.count > pageSize)
        }
        var response = Tasks_V1_ListMarketTasksResponse()
        response.tasks = try await marketMessages(rows)
        if more, let last = rows.last { response.nextPageToken = core.pageTokens.make(cursor: [last.id], filters: filters) }
        return response
    }

    public func searchMarketTasks(
        request: Tasks_V1_SearchMarketTasksRequest, context: ServerContext
    ) async throws -> Tasks_V1_SearchMarketTasksResponse {
        _ = try core.caller(context)
        var errors = FieldErrors()
        let words = MarketRules.keywords(request.keywords, into: &errors).map(TextFold.fold)
        let statuses = MarketRules.statuses(
            request.statuses, allowed: [1, 2], defaults: [1, 2], what: "search covers open tasks: REQUESTED or BIDDED", into: &errors)
        let near = request.hasNear ? Geo.point(request.near, field: "near", into: &errors) : nil
        var radius: Double?
        if request.hasMaxDistanceKm {
            let r = request.maxDistanceKm.value
            if !request.hasNear { errors.add("max_distance_km", "needs `near` (a distance from where?)") }
            if !r.isFinite || r <= 0 || r > 20000 { errors.add("max_distance_km", "must be more than 0 and at most 20000 km") } else { radius = r }
        }
        let pageSize = FieldRules.pageSize(request.pageSize, defaultSize: 20, into: &errors)
        let query = MarketSearch.Query(words: words, statuses: statuses, near: near, radiusKm: radius)
        let filters = "market-search:\(query.fingerprint)"
        let cursor = core.pageTokens.cursor(request.pageToken, filters: filters, parts: 2, into: &errors)
        try errors.throwIfAny()
        let useIndexes = core.configuration.searchUsesIndexes
        // One read: the hits and their tasks.
        let (hits, more, rows) = try await core.read { c in
            let (hits, more) = try MarketSearch.run(c, query, after: cursor, limit: pageSize, useIndexes: useIndexes)
            return (hits, more, try MarketStore.load(c, ids: hits.map(\.id)))
        }
        let messages = try await marketMessages(rows)
        var response = Tasks_V1_SearchMarketTasksResponse()
        response.results = zip(hits, messages).map { hit, task in
            var r = Tasks_V1_MarketTaskSearchResult()
            r.task = task
            if let d = hit.distance {
                var v = Google_Protobuf_DoubleValue()
                v.value = d
                r.distanceKm = v
            }
            return r
        }
        if more, let last = hits.last { response.nextPageToken = core.pageTokens.make(cursor: last.cursor, filters: filters) }
        return response
    }

    // MARK: Bids

    static func bid(_ db: some SQLReader, id: String) throws -> MarketStore.Bid? {
        try db.queryOne("SELECT \(MarketStore.bidColumns) FROM market_bids WHERE id = ?", id).map(MarketStore.bid)
    }

    public func placeBid(request: Tasks_V1_PlaceBidRequest, context: ServerContext) async throws -> Tasks_V1_PlaceBidResponse {
        let me = try core.caller(context)
        var errors = FieldErrors()
        let key = FieldRules.idempotencyKey(request.idempotencyKey, into: &errors)
        let taskID = FieldRules.id(request.taskId, field: "task_id", into: &errors)
        let amount = MarketRules.amount(request.hasAmount ? request.amount : nil, into: &errors)
        try errors.throwIfAny()
        guard let amount else { throw RPCError(.invalidArgument, "invalid request: amount") }
        let scope = "PlaceBid:\(me)", fingerprint = Idempotency.fingerprint(request)
        if var replay = try await core.store.storedAnswer(scope: scope, key: key, fingerprint: fingerprint, as: Tasks_V1_PlaceBidResponse.self) {
            replay.replayed = true
            return replay
        }
        let users = try await core.users.lookUp([me])
        let now = core.now, core = self.core
        let (response, replayed) = try await core.write { tx in
            try tx.idempotent(scope: scope, key: key, fingerprint: fingerprint, now: now) {
                let t = try Self.visibleTask(tx, id: taskID, me: me)
                guard t.requesterID != me else { throw RPCError(.permissionDenied, "you cannot bid on your own task") }
                guard t.status.isOpen else { throw RPCError(.failedPrecondition, "the task is no longer open for bids (it was assigned)") }
                if try tx.queryOne("SELECT 1 FROM market_declined_bidders WHERE task_id = ? AND provider_id = ?", taskID, me) != nil {
                    throw RPCError(.failedPrecondition, "the requester declined your bid on this task")
                }
                if let other = try tx.queryOne(
                    "SELECT currency FROM market_bids WHERE task_id = ? AND status = 1 AND provider_id IS NOT ? LIMIT 1", taskID, me)?.get(
                        0, as: String.self), other != amount.currency
                {
                    throw FieldErrors.single(.invalidArgument, field: "amount.currency", "the bids on this task are in \(other)")
                }
                let bidID: String
                if let existing = try tx.queryOne("SELECT id FROM market_bids WHERE task_id = ? AND provider_id = ?", taskID, me)?.get(
                    0, as: String.self)
                {
                    // A replaced bid gets a new id: a requester accepting what they saw (the old
                    // id) gets NOT_FOUND instead of the new amount (no bait-and-switch).
                    bidID = ULID.make(now: now)
                    try tx.execute(
                        "UPDATE market_bids SET id = ?, amount_cents = ?, currency = ?, created_at = ? WHERE id = ?", bidID, amount.cents,
                        amount.currency, now, existing)
                } else {
                    bidID = ULID.make(now: now)
                    try tx.execute(
                        "INSERT INTO market_bids (id, task_id, provider_id, amount_cents, currency, status, created_at) VALUES (?, ?, ?, ?, ?, 1, ?)",
                        bidID, taskID, me, amount.cents, amount.currency, now)
                }
                let status = try MarketStore.settleOpenStatus(tx, task: taskID, now: now)
                try UserDirectory.remember(tx, users.values, now: now)
                let name = Self.displayName(users.ref(me))
                try core.notify(
                    tx, kind: .newBid, recipients: [t.requesterID].compactMap { $0 }, actor: me, title: "New bid on \(t.title)",
                    body: "\(name) bids \(Self.format(amount.cents, amount.currency)) on \"\(t.title)\".", target: .taskId(t.id),
                    data: ["task_id": t.id, "bid_id": bidID, "area": "marketplace"], eventID: "tasks:new-bid:\(ULID.make(now: now))")
                guard let bid = try Self.bid(tx, id: bidID) else { throw RPCError(.internal, "bid vanished") }
                var out = Tasks_V1_PlaceBidResponse()
                out.bid = MarketStore.proto(bid, users: users)
                out.taskStatus = Tasks_V1_MarketTaskStatus(rawValue: Int32(status.rawValue))
                return out
            }
        }
        var out = response
        out.replayed = replayed
        return out
    }

    /// "45.00 CAD".
    static func format(_ cents: Int64, _ currency: String) -> String {
        let sign = cents < 0 ? "-" : ""
        let a = abs(cents)
        return "\(sign)\(a / 100).\(String(format: "%02d", Int(a % 100))) \(currency)"
    }

    public func deleteBid(request: Tasks_V1_DeleteBidRequest, context: ServerContext) async throws -> Tasks_V1_DeleteBidResponse {
        let me = try core.caller(context)
        let bidID = try Self.marketTaskID(request.bidId, field: "bid_id")
        let now = core.now
        let status = try await core.write { tx -> MarketStore.Status in
            guard let bid = try Self.bid(tx, id: bidID) else { throw RPCError(.notFound, "no such bid") }
            guard bid.providerID == me else { throw RPCError(.permissionDenied, "this is someone else's bid") }
            guard !bid.accepted else { throw RPCError(.failedPrecondition, "this bid was accepted: the task is assigned to you") }
            guard let t = try MarketStore.one(tx, id: bid.taskID) else { throw RPCError(.notFound, "no such bid") }
            guard t.status.isOpen else { throw RPCError(.failedPrecondition, "the task was assigned to another bid: bids can no longer change") }
            try tx.execute("DELETE FROM market_bids WHERE id = ?", bidID)
            return try MarketStore.settleOpenStatus(tx, task: t.id, now: now)
        }
        var response = Tasks_V1_DeleteBidResponse()
        response.taskStatus = Tasks_V1_MarketTaskStatus(rawValue: Int32(status.rawValue))
        return response
    }

    public func listBids(request: Tasks_V1_ListBidsRequest, context: ServerContext) async throws -> Tasks_V1_ListBidsResponse {
        let me = try core.caller(context)
        var errors = FieldErrors()
        let taskID = FieldRules.id(request.taskId, field: "task_id", into: &errors)
        let pageSize = FieldRules.pageSize(request.pageSize, defaultSize: 50, into: &errors)
        let filters = "bids:\(taskID):\(me)"
        let cursor = core.pageTokens.cursor(request.pageToken, filters: filters, parts: 3, into: &errors)
        try errors.throwIfAny()
        let (bids, more, users) = try await core.read { c -> ([MarketStore.Bid], Bool, [String: Common_V1_UserRef]) in
            let t = try Self.visibleTask(c, id: taskID, me: me)
            var sql = "SELECT \(MarketStore.bidColumns) FROM market_bids WHERE task_id = ?"
            var args: [DatabaseValue] = [.text(taskID)]
            if t.requesterID != me {
                sql += " AND provider_id = ?"
                args.append(.text(me))
            }
            if let cursor, let amount = Int64(cursor[0]), let at = Int64(cursor[1]) {
                sql += " AND (amount_cents, created_at, id) > (?, ?, ?)"
                args += [.integer(amount), .integer(at), .text(cursor[2])]
            }
            sql += " ORDER BY amount_cents, created_at, id LIMIT ?"
            args.append(.integer(Int64(pageSize + 1)))
            let bids = try c.query(sql, arguments: args).map(MarketStore.bid)
            let page = Array(bids.prefix(pageSize))
            return (page, bids.count > pageSize, try UserDirectory.cached(c, page.compactMap(\.providerID)))
        }
        var response = Tasks_V1_ListBidsResponse()
        response.bids = bids.map { MarketStore.proto($0, users: users) }
        if more, let last = bids.last {
            response.nextPageToken = core.pageTokens.make(cursor: [String(last.cents), String(last.createdAt), last.id], filters: filters)
        }
        return response
    }

    /// The bid and its task, for a decision only the requester makes.
    static func requesterBid(_ tx: Transaction, bidID: String, me: String, what: String) throws -> (MarketStore.Bid, MarketStore.Row) {
        guard let bid = try Self.bid(tx, id: bidID), let t = try MarketStore.one(tx, id: bid.taskID), try MarketStore.visible(tx, t, to: me)
        else { throw RPCError(.notFound, "no such bid") }
        guard t.requesterID == me else { throw RPCError(.permissionDenied, "only the task's requester can \(what) a bid") }
        return (bid, t)
    }

    public func acceptBid(request: Tasks_V1_AcceptBidRequest, context: ServerContext) async throws -> Tasks_V1_AcceptBidResponse {
        let me = try core.caller(context)
        let bidID = try Self.marketTaskID(request.bidId, field: "bid_id")
        let now = core.now, core = self.core
        // The writer runs one transaction at a time: of two accepts racing, the second finds the
        // task ASSIGNED and is refused.
        let task = try await core.write { tx -> MarketStore.Row in
            let (bid, t) = try Self.requesterBid(tx, bidID: bidID, me: me, what: "accept")
            guard t.status == .bidded, !bid.accepted else {
                throw RPCError(
                    .failedPrecondition,
                    t.status == .assigned || t.status == .done
                        ? "the task is already assigned (a bid was accepted): nothing changed" : "the task has no active bids")
            }
            try tx.execute("UPDATE market_bids SET status = 2 WHERE id = ?", bidID)
            try tx.execute(
                "UPDATE market_tasks SET status = 3, assignee_id = ?, accepted_bid_id = ?, updated_at = ? WHERE id = ?", bid.providerID, bidID, now,
                t.id)
            try core.notify(
                tx, kind: .bidAccepted, recipients: [bid.providerID].compactMap { $0 }, actor: me, title: "Bid accepted: \(t.title)",
                body: "Your bid of \(Self.format(bid.cents, bid.currency)) on \"\(t.title)\" was accepted.", target: .taskId(t.id),
                data: ["task_id": t.id, "bid_id": bidID, "area": "marketplace"], eventID: "tasks:bid-accepted:\(bidID):\(now)")
            guard let after = try MarketStore.one(tx, id: t.id) else { throw RPCError(.notFound, Self.marketTaskNotFound) }
            return after
        }
        var response = Tasks_V1_AcceptBidResponse()
        response.task = try await marketMessages([task])[0]
        return response
    }

    public func declineBid(request: Tasks_V1_DeclineBidRequest, context: ServerContext) async throws -> Tasks_V1_DeclineBidResponse {
        let me = try core.caller(context)
        let bidID = try Self.marketTaskID(request.bidId, field: "bid_id")
        let now = core.now, core = self.core
        let status = try await core.write { tx -> MarketStore.Status in
            let (bid, t) = try Self.requesterBid(tx, bidID: bidID, me: me, what: "decline")
            guard t.status.isOpen, !bid.accepted else {
                throw RPCError(.failedPrecondition, "the task is assigned: use \"not complete\" to reopen it before declining bids")
            }
            try tx.execute("DELETE FROM market_bids WHERE id = ?", bidID)
            if let provider = bid.providerID {
                try tx.execute(
                    "INSERT OR IGNORE INTO market_declined_bidders (task_id, provider_id, declined_at) VALUES (?, ?, ?)", t.id, provider, now)
            }
            try core.notify(
                tx, kind: .bidDeclined, recipients: [bid.providerID].compactMap { $0 }, actor: me, title: "Bid declined: \(t.title)",
                body: "Your bid of \(Self.format(bid.cents, bid.currency)) on \"\(t.title)\" was declined.", target: .taskId(t.id),
                data: ["task_id": t.id, "bid_id": bidID, "area": "marketplace"], eventID: "tasks:bid-declined:\(bidID)")
            return try MarketStore.settleOpenStatus(tx, task: t.id, now: now)
        }
        var response = Tasks_V1_DeclineBidResponse()
        response.taskStatus = Tasks_V1_MarketTaskStatus(rawValue: Int32(status.rawValue))
        return response
    }

    // MARK: Done, not complete

    public func markMarketTaskDone(
        request: Tasks_V1_MarkMarketTaskDoneRequest, context: ServerContext
    ) async throws -> Tasks_V1_MarkMarketTaskDoneResponse {
        let me = try core.caller(context)
        let id = try Self.marketTaskID(request.taskId)
        let now = core.now, core = self.core
        let task = try await core.write { tx -> MarketStore.Row in
            let t = try Self.ownTask(tx, id: id, me: me, what: "mark it done")
            if t.status == .done { return t }
            guard t.status == .assigned, let bid = t.acceptedBid, let requester = t.requesterID else {
                throw RPCError(.failedPrecondition, "only an assigned task can be marked done (accept a bid first)")
            }
            try tx.execute("UPDATE market_tasks SET status = 4, done_at = ?, updated_at = ? WHERE id = ?", now, now, id)
            // The provider's account was deleted (EraseUser kept their accepted bid, anonymised):
            // the task is done, but nobody is left to owe, so no settlement goes to finance (it
            // could name no creditor) and nobody is told.
            guard let provider = bid.providerID else {
                guard let after = try MarketStore.one(tx, id: id) else { throw RPCError(.notFound, Self.marketTaskNotFound) }
                return after
            }
            // The settlement: in this transaction, delivered until finance acknowledges it; finance
            // keeps one per task_id, and the event id is the task's, so it exists exactly once.
            var s = Finance_V1_RecordTaskSettlementRequest()
            s.idempotencyKey = "tasks:settlement:\(id)"
            s.taskId = id
            s.requesterUserId = requester
            s.providerUserId = provider
            s.amount = MarketStore.money(bid.cents, bid.currency)
            s.description_p = t.title
            try tx.enqueueCall(Finance_V1_FinanceInternalMethods.recordTaskSettlement, s, eventID: s.idempotencyKey)
            try core.notify(
                tx, kind: .taskDone, recipients: [provider], actor: me, title: "Done: \(t.title)",
                body: "\"\(t.title)\" was marked done: \(Self.format(bid.cents, bid.currency)) is recorded as owed to you.", target: .taskId(id),
                data: ["task_id": id, "area": "marketplace"], eventID: "tasks:task-done:\(id)")
            guard let after = try MarketStore.one(tx, id: id) else { throw RPCError(.notFound, Self.marketTaskNotFound) }
            return after
        }
        var response = Tasks_V1_MarkMarketTaskDoneResponse()
        response.task = try await marketMessages([task])[0]
        return response
    }

    public func markMarketTaskNotComplete(
        request: Tasks_V1_MarkMarketTaskNotCompleteRequest, context: ServerContext
    ) async throws -> Tasks_V1_MarkMarketTaskNotCompleteResponse {
        let me = try core.caller(context)
        let id = try Self.marketTaskID(request.taskId)
        let now = core.now, core = self.core
        let task = try await core.write { tx -> MarketStore.Row in
            let t = try Self.ownTask(tx, id: id, me: me, what: "mark it not complete")
            guard t.status == .assigned else {
                throw RPCError(
                    .failedPrecondition,
                    t.status == .done ? "the task is done: it cannot be reopened" : "only an assigned task can be marked not complete")
            }
            try Self.reopen(core, tx, t, actor: me, now: now, reason: "marked \"\(t.title)\" not complete")
            guard let after = try MarketStore.one(tx, id: id) else { throw RPCError(.notFound, Self.marketTaskNotFound) }
            return after
        }
        var response = Tasks_V1_MarkMarketTaskNotCompleteResponse()
        response.task = try await marketMessages([task])[0]
        return response
    }

    /// An ASSIGNED task back to BIDDED or REQUESTED: the accepted bid goes (its provider told).
    static func reopen(_ core: TasksCore, _ tx: Transaction, _ t: MarketStore.Row, actor: String?, now: Int64, reason: String) throws {
        if let bid = t.acceptedBid {
            try tx.execute("DELETE FROM market_bids WHERE id = ?", bid.id)
            try core.notify(
                tx, kind: .bidDeclined, recipients: [bid.providerID].compactMap { $0 }, actor: actor ?? "", title: "Not complete: \(t.title)",
                body: "The requester \(reason); your accepted bid was removed.", target: .taskId(t.id),
                data: ["task_id": t.id, "bid_id": bid.id, "area": "marketplace"], eventID: "tasks:not-complete:\(bid.id)")
        }
        try tx.execute("UPDATE market_tasks SET status = 1, assignee_id = NULL, accepted_bid_id = NULL, updated_at = ? WHERE id = ?", now, t.id)
        _ = try MarketStore.settleOpenStatus(tx, task: t.id, now: now)
    }
}

// MARK: Account deletion

extension TasksService {
    /// The marketplace part of EraseUser: the user's open requests are withdrawn (bidders told),
    /// their ASSIGNED requests too (the provider told: nobody can mark them done or not complete
    /// any more), their DONE requests kept with the requester anonymised; their active bids
    /// removed (a task left without bids back to REQUESTED); their accepted bids kept, anonymised,
    /// on DONE tasks and on ASSIGNED ones alike (the task stays ASSIGNED: its requester marks it
    /// done, with no settlement, or not complete). Settlements in finance are not touched.
    static func eraseMarketplace(_ core: TasksCore, _ tx: Transaction, user: String, now: Int64) throws {
        let requested = try tx.query("SELECT id FROM market_tasks WHERE requester_id = ? AND status IN (1, 2, 3)", user).map {
            try $0.get(0, as: String.self)
        }
        for t in try MarketStore.load(tx, ids: requested) {
            try withdraw(core, tx, t, actor: nil, reason: "The requester's account was deleted")
        }
        try tx.execute("UPDATE market_tasks SET requester_id = NULL WHERE requester_id = ?", user)
        let bidOn = try tx.query("SELECT task_id FROM market_bids WHERE provider_id = ? AND status = 1", user).map { try $0.get(0, as: String.self) }
        try tx.execute("DELETE FROM market_bids WHERE provider_id = ? AND status = 1", user)
        for task in bidOn { _ = try MarketStore.settleOpenStatus(tx, task: task, now: now) }
        try tx.execute("UPDATE market_bids SET provider_id = NULL WHERE provider_id = ?", user)
        try tx.execute("DELETE FROM market_declined_bidders WHERE provider_id = ?", user)
        try tx.execute("UPDATE market_tasks SET assignee_id = NULL WHERE assignee_id = ?", user)
    }
}
