import Contracts
import Foundation
import Logging
import ServiceKit
import ServiceKitTesting
import Storage
import Testing

@testable import Tasks

/// The folding rule itself (`TextFold`): NFKC, then Unicode full case folding without the Turkic
/// mappings, then NFKC; accents kept.
@Suite("Text folding (pure)")
struct TextFoldRuleTests {
    func same(_ forms: [String]) -> Bool { Set(forms.map(TextFold.fold)).count == 1 }

    @Test func germanUmlautsAndSharpS() {
        #expect(same(["über", "Über", "ÜBER", "u\u{308}ber", "U\u{308}BER"]))
        #expect(TextFold.fold("ÜBER") == "\u{FC}ber")
        #expect(same(["straße", "STRASSE", "Strasse", "STRAẞE"]))
        #expect(TextFold.fold("ß") == "ss")
        #expect(TextFold.fold("über") != TextFold.fold("uber"))  // accents are kept
    }

    @Test func turkishIsTheDefaultNotTheTurkicRule() {
        #expect(TextFold.fold("I") == "i")
        #expect(TextFold.fold("İ") == "i\u{307}")  // dotted capital: i + combining dot above
        #expect(TextFold.fold("ı") == "ı")  // dotless: stays, matches only itself
        #expect(same(["İstanbul", "İSTANBUL", "i\u{307}stanbul"]))
        #expect(!TextFold.contains(TextFold.fold("İstanbul"), TextFold.fold("istanbul")))
        #expect(TextFold.contains(TextFold.fold("İstanbul"), TextFold.fold("stanbul")))
        #expect(!TextFold.contains(TextFold.fold("kırmızı"), TextFold.fold("KIRMIZI")))
    }

    @Test func greekFinalSigmaIsSigma() {
        #expect(same(["ΟΔΟΣ", "οδος", "οδοσ", "ΟΔΟσ"]))
        #expect(same(["ς", "σ", "Σ"]))
        #expect(same(["ΟΔΌΣ", "οδός", "Οδός", "ο\u{3B4}ο\u{301}ς"]))
        #expect(TextFold.fold("οδός") != TextFold.fold("οδος"))  // the tonos is kept
    }

    @Test func composedAndDecomposedAccentsAndCompatibilityForms() {
        #expect(same(["caf\u{E9}", "cafe\u{301}", "CAF\u{C9}", "CAFE\u{301}"]))
        #expect(TextFold.fold("cafe\u{301}").unicodeScalars.count == 4)
        #expect(same(["ﬁle", "FILE", "file"]))
        #expect(same(["Ｔｅｓｔ", "test"]))
        #expect(TextFold.fold("50%_\\") == "50%_\\")
    }

    @Test func matchesAreSubstringsOfScalars() {
        #expect(TextFold.contains("i\u{307}stanbul", "i"))  // part of a character, as instr and FTS5 see it
        #expect(!TextFold.contains(TextFold.fold("café"), "e"))
        #expect(TextFold.contains("abc", ""))
    }
}

/// Habit history's `comment_contains` and the marketplace's keywords fold Unicode by that one rule,
/// over gRPC, on every path a search can take.
@Suite("Tasks: case-insensitive matching in every script", .serialized)
struct TextFoldMatchingTests {
    static let day: Duration = .seconds(86400)

    @Test func habitHistoryCommentContainsFoldsUnicode() async throws {
        try await withWorld(now: HabitTests.monday) { w in
            let (alice, bob) = (try await w.user("alice"), try await w.user("bob"))
            try await w.follow(bob, alice)
            let daily: [Common_V1_Weekday] = [.monday, .tuesday, .wednesday, .thursday, .friday, .saturday, .sunday]
            let habit = try await w.habit(alice, newHabit("Diary", days: daily)).habitId
            let comments = [
                "Über den Berg", "U\u{308}BER ALLES", "Straße", "STRASSE", "İstanbul", "ISTANBUL", "kırmızı", "ΟΔΟΣ", "Οδός",
                "caf\u{E9}", "CAFE\u{301}", "50% off", "a_b", "plain",
            ]
            var ids: [String: String] = [:]
            for c in comments {
                ids[c] = try await w.event(alice, newEvent(habit, comment: c)).eventId
                w.clock.advance(by: Self.day)
            }
            // The stored comment is what was sent; only the folded copy is normalised.
            let stored = try await w.history(alice, Tasks_V1_ListHabitHistoryRequest()).map { $0.comment.unicodeScalars.map(\.value) }
            #expect(Set(stored) == Set(comments.map { $0.unicodeScalars.map(\.value) }))
            // Typing a word last so that the edit path folds it too.
            var edit = Tasks_V1_UpdateHabitEventRequest()
            edit.eventId = ids["plain"]!
            edit.comment.value = "GRÜẞE"
            _ = try await w.tasks.updateHabitEvent(edit, options: alice.options)
            ids["GRÜẞE"] = ids["plain"]

            let cases: [(String, [String])] = [
                ("über", ["Über den Berg", "U\u{308}BER ALLES"]),
                ("ÜBER", ["Über den Berg", "U\u{308}BER ALLES"]),
                ("u\u{308}ber", ["Über den Berg", "U\u{308}BER ALLES"]),
                ("ü", ["Über den Berg", "U\u{308}BER ALLES", "GRÜẞE"]),
                ("straße", ["Straße", "STRASSE"]),
                ("ẞ", ["Straße", "STRASSE", "GRÜẞE"]),
                ("grüsse", ["GRÜẞE"]),
                ("İSTANBUL", ["İstanbul"]),
                ("istanbul", ["ISTANBUL"]),
                ("stanbul", ["İstanbul", "ISTANBUL"]),
                ("ı", ["kırmızı"]),
                ("KIRMIZI", []),
                ("οδος", ["ΟΔΟΣ"]),
                ("ος", ["ΟΔΟΣ"]),
                ("ΟΔΌΣ", ["Οδός"]),
                ("ς", ["ΟΔΟΣ", "Οδός"]),
                ("café", ["caf\u{E9}", "CAFE\u{301}"]),
                ("CAFE\u{301}", ["caf\u{E9}", "CAFE\u{301}"]),
                ("cafe", []),
                ("%", ["50% off"]),
                ("_", ["a_b"]),
                ("\\", []),
            ]
            for (query, expected) in cases {
                var h = Tasks_V1_ListHabitHistoryRequest()
                h.commentContains = query
                h.pageSize = 2
                let mine = try await w.history(alice, h).map(\.eventId)
                #expect(Set(mine) == Set(expected.map { ids[$0]! }) && mine.count == expected.count, "MINE \(query)")
                h.scope = .all
                #expect(try await w.history(bob, h).map(\.eventId) == mine, "ALL \(query)")
                // FOLLOWING: the latest matching event of the habit (one backward seek per habit).
                h.scope = .following
                #expect(try await w.history(bob, h).map(\.eventId) == Array(mine.prefix(1)), "FOLLOWING \(query)")
            }
        }
    }

    @Test func marketplaceKeywordsFoldUnicodeShortAndLongAlike() async throws {
        try await withWorld { w in
            let (alice, bob) = (try await w.user("alice"), try await w.user("bob"))
            let here = point(53.5444, -113.4909)
            let tasks: [(String, String)] = [
                ("Über-Umzug", ""), ("UMZUG", "u\u{308}ber den Rhein"), ("Straße fegen", ""), ("STRASSE", ""), ("ΟΔΟΣ", ""),
                ("Οδός", ""), ("Caf\u{E9}", ""), ("CAFE\u{301}", ""), ("İzmir", ""), ("izmir", ""), ("ırmak", ""), ("50% off", ""),
                ("a_b", ""),
            ]
            var ids: [String: String] = [:]
            for (i, (title, description)) in tasks.enumerated() {
                let at = point(53.5444 + Double(i) * 0.001, -113.4909)
                ids[title] = try await w.post(alice, newMarketTask(title, description: description, at: at)).taskId
            }
            let cases: [(String, [String])] = [
                ("über", ["Über-Umzug", "UMZUG"]),
                ("ÜB", ["Über-Umzug", "UMZUG"]),
                ("ü", ["Über-Umzug", "UMZUG"]),
                ("u\u{308}", ["Über-Umzug", "UMZUG"]),
                ("ß", ["Straße fegen", "STRASSE"]),
                ("STRAẞE", ["Straße fegen", "STRASSE"]),
                ("strasse", ["Straße fegen", "STRASSE"]),
                ("οδος", ["ΟΔΟΣ"]),
                ("ΟΣ", ["ΟΔΟΣ"]),
                ("ς", ["ΟΔΟΣ", "Οδός"]),
                ("ΟΔΌΣ", ["Οδός"]),
                ("café", ["Caf\u{E9}", "CAFE\u{301}"]),
                ("É", ["Caf\u{E9}", "CAFE\u{301}"]),
                ("cafe", []),
                ("İ", ["İzmir"]),
                ("izmir", ["izmir"]),
                ("zmir", ["İzmir", "izmir"]),
                ("ı", ["ırmak"]),
                ("IRMAK", []),
                ("%", ["50% off"]),
                ("_", ["a_b"]),
                ("50%", ["50% off"]),
                ("über umzug", ["Über-Umzug", "UMZUG"]),
                ("üb UMZ", ["Über-Umzug", "UMZUG"]),
            ]
            for (keywords, expected) in cases {
                let want = Set(expected.map { ids[$0]! })
                var s = Tasks_V1_SearchMarketTasksRequest()
                s.keywords = keywords
                // No point (FTS5 drives; instr for short words), then a circle (rows read and
                // checked here).
                #expect(Set(try await w.tasks.searchMarketTasks(s, options: bob.options).results.map(\.task.taskId)) == want, "\(keywords)")
                s.near = here
                s.maxDistanceKm.value = 50
                #expect(Set(try await w.tasks.searchMarketTasks(s, options: bob.options).results.map(\.task.taskId)) == want, "near \(keywords)")
                // The full scan, and a circle answered in SQL (with and without FTS5 narrowing).
                var errors = FieldErrors()
                let words = MarketRules.keywords(keywords, into: &errors).map(TextFold.fold)
                let centre = GeoPoint(latitude: 53.5444, longitude: -113.4909)
                let q = MarketSearch.Query(words: words, statuses: [1, 2], near: centre, radiusKm: 50)
                let scanned = try await w.core.read { c in try MarketSearch.run(c, q, after: nil, limit: 100, useIndexes: false).0.map(\.id) }
                #expect(Set(scanned) == want, "scan \(keywords)")
                for narrowed in [false, true] {
                    let inSQL = try await w.core.read { c in
                        let box = Geo.rtreeCondition(Geo.boundingBox(center: centre, radiusKm: 50), alias: "g")
                        let d = Geo.sqlDistance(
                            lat: "t.latitude", lon: "t.longitude", latParam: MarketSearch.literal(centre.latitude),
                            lonParam: MarketSearch.literal(centre.longitude))
                        return try MarketSearch.nearestInSQL(
                            c, q, box: box, distance: d, radius: 50, narrowedByWords: narrowed, after: nil,
                            limit: 100
                        ).0.map(\.id)
                    }
                    #expect(Set(inSQL) == want, "in SQL (narrowed: \(narrowed)) \(keywords)")
                }
            }
            // Edits and deletes keep the index of the folded text exact.
            var edit = Tasks_V1_UpdateMarketTaskRequest()
            edit.taskId = ids["izmir"]!
            edit.title.value = "ÖL wechseln"
            edit.description_p.value = "ΣΟΦΊΑ"
            _ = try await w.tasks.updateMarketTask(edit, options: alice.options)
            var del = Tasks_V1_DeleteMarketTaskRequest()
            del.taskId = ids["ırmak"]!
            _ = try await w.tasks.deleteMarketTask(del, options: alice.options)
            for (keywords, expected) in [("öl", ["izmir"]), ("σοφία", ["izmir"]), ("zmir", ["İzmir"]), ("ı", []), ("IRMAK", [])] {
                var s = Tasks_V1_SearchMarketTasksRequest()
                s.keywords = keywords
                #expect(
                    Set(try await w.tasks.searchMarketTasks(s, options: bob.options).results.map(\.task.taskId)) == Set(expected.map { ids[$0]! }),
                    "after edits: \(keywords)")
            }
            // FTS5's own check of the index against the folded columns it indexes.
            try await w.core.write { tx in
                try tx.execute("INSERT INTO market_task_text (market_task_text, rank) VALUES ('integrity-check', 1)")
            }
        }
    }

    /// Rows written before the folded columns existed are folded by the migrations, and the
    /// rebuilt trigram index finds them.
    @Test func theMigrationsFoldExistingRows() async throws {
        let dir = TemporaryDirectory("tasks-fold")
        defer { dir.remove() }
        var logger = Logger(label: "tasks-fold-test")
        logger.logLevel = .warning
        let before = Array(TasksSchema.migrations.prefix { $0.name != MarketStore.foldedText.name })
        #expect(before.count == TasksSchema.migrations.count - 3)  // then habits.003-folded-comment and reminders.001-tables
        let old = try Database.open(directory: dir.path, fileName: TasksSchema.fileName, migrations: before, logger: logger)
        try old.writeSync { tx in
            for (n, title) in [(1, "Über-Umzug"), (2, "CAFE\u{301}"), (3, "ΟΔΟΣ")] {
                try tx.execute(
                    """
                    INSERT INTO market_tasks (n, id, requester_id, title, description, latitude, longitude, status, created_at, updated_at)
                    VALUES (?, ?, 'u1', ?, 'STRASSE', 53.5, -113.5, 1, 0, 0)
                    """, Int64(n), "t\(n)", title)
            }
            try tx.execute(
                """
                INSERT INTO habits (id, owner_id, title, title_key, reason, weekdays, start_day, created_at, updated_at)
                VALUES ('h1', 'u1', 'Run', 'run', '', 127, 20250303, 0, 0)
                """)
            for (n, comment) in [(1, "Über den Berg"), (2, "ΟΔΟΣ"), (3, "")] {
                try tx.execute(
                    """
                    INSERT INTO habit_events (n, id, habit_id, owner_id, day, comment, utc_offset, created_at, updated_at)
                    VALUES (?, ?, 'h1', 'u1', ?, ?, 0, 0, 0)
                    """, Int64(n), "e\(n)", Int64(20_250_303 + n), comment)
            }
        }
        old.close()
        let db = try Database.open(directory: dir.path, schema: TasksSchema.schema, logger: logger)
        defer { db.close() }
        try db.readSync { c in
            let folded = try c.query("SELECT title_folded, description_folded FROM market_tasks ORDER BY n").map {
                [try $0.get(0, as: String.self), try $0.get(1, as: String.self)]
            }
            #expect(folded == [["\u{FC}ber-umzug", "strasse"], ["caf\u{E9}", "strasse"], ["οδοσ", "strasse"]])
            #expect(
                try c.query("SELECT comment_folded FROM habit_events ORDER BY n").map { try $0.get(0, as: String.self) } == [
                    "\u{FC}ber den berg", "οδοσ", "",
                ])
            for (words, expected) in [(["über"], ["t1"]), (["ü"], ["t1"]), (["café"], ["t2"]), (["οδος"], ["t3"]), (["straße"], ["t3", "t2", "t1"])] {
                let q = MarketSearch.Query(words: words.map(TextFold.fold), statuses: [1, 2], near: nil, radiusKm: nil)
                #expect(try MarketSearch.run(c, q, after: nil, limit: 10, useIndexes: true).0.map(\.id) == expected, "\(words)")
            }
            let latest = try TasksService.latestPerHabit(
                c, owners: ["u1"], habitIDs: [], comment: "ÜBER", after: nil, limit: 10, photos: false)
            #expect(latest.0.map(\.id) == ["e1"])
        }
        try db.writeSync { tx in try tx.execute("INSERT INTO market_task_text (market_task_text, rank) VALUES ('integrity-check', 1)") }
    }
}
