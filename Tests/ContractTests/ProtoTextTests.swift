import ContractTesting
import Testing

/// The text comparison under the harness: parsing protoc's output, removing generated paths,
/// flattening with repeated indices and map keys, diffing.
@Suite struct ProtoTextTests {
    static let listResponse = """
        notifications {
          notification_id: "n1"
          title: "a {"
          created_at {
            seconds: 1
          }
          data {
            key: "k"
            value: "v"
          }
        }
        notifications {
          notification_id: "n2"
          title: "b"
          created_at {
            seconds: 2
          }
        }
        next_page_token: "t"

        """

    @Test func parsesNestedBlocksAndTrickyStrings() throws {
        let nodes = try ProtoText.parse(Self.listResponse)
        #expect(nodes.map(\.name) == ["notifications", "notifications", "next_page_token"])
        #expect(nodes[0].children[1] == TextNode(name: "title", value: "\"a {\"", children: []))
        #expect(throws: ContractError.self) { try ProtoText.parse("a {\n") }
    }

    @Test func removesGeneratedPathsThroughRepeatedFields() throws {
        let nodes = ProtoText.removing(["notifications.notification_id", "notifications.created_at"], from: try ProtoText.parse(Self.listResponse))
        let lines = ProtoText.flatten(nodes, message: "social.v1.ListNotificationsResponse")
        #expect(
            lines == [
                "notifications[0].title: \"a {\"",
                "notifications[0].data[\"k\"]: \"v\"",
                "notifications[1].title: \"b\"",
                "next_page_token: \"t\"",
            ])
    }

    @Test func mapsWithGeneratedKeysCompareByContent() throws {
        // protoc sorts map entries by key; with generated keys the live order is arbitrary.
        func lines(_ first: String, _ second: String) throws -> [String] {
            let text = """
                users_by_id {
                  key: "\(first)"
                  value {
                    user_id: "\(first)"
                    username: "alice"
                  }
                }
                users_by_id {
                  key: "\(second)"
                  value {
                    user_id: "\(second)"
                    username: "bob"
                  }
                }
                """
            let nodes = ProtoText.removing(["users_by_id.key", "users_by_id.value.user_id"], from: try ProtoText.parse(text))
            return ProtoText.flatten(nodes, message: "accounts.v1.GetUsersByIdsResponse")
        }
        #expect(try lines("1", "2") == ["users_by_id[*].username: \"alice\"", "users_by_id[*].username: \"bob\""])
        #expect(try lines("1", "2") == lines("9", "3"))
    }

    @Test func diffListsOnlyDifferences() {
        #expect(
            ProtoText.diff(expected: ["a: 1", "b: 2", "c: 3"], actual: ["a: 1", "b: 5", "c: 3", "d: 4"])
                == ["- b: 2", "+ b: 5", "+ d: 4"])
        #expect(ProtoText.diff(expected: ["x"], actual: ["x"]).isEmpty)
    }

    @Test func schemaResolvesGeneratedPaths() {
        let schema = ProtoSchema.contracts
        #expect(schema.checkPath("user.created_at", in: "accounts.v1.SignUpResponse") == nil)
        #expect(schema.checkPath("user.created_at.seconds", in: "accounts.v1.SignUpResponse") == nil)
        #expect(schema.checkPath("user.nope", in: "accounts.v1.SignUpResponse") != nil)
        #expect(schema.checkPath("user.username.x", in: "accounts.v1.SignUpResponse") != nil)
    }
}
