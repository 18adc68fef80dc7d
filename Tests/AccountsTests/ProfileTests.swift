import Accounts
import Contracts
import Foundation
import RPCCore
import Testing

@Suite("Accounts: profiles, search, avatars")
struct ProfileTests {
    func byID(_ id: String) -> Accounts_V1_GetProfileRequest {
        var r = Accounts_V1_GetProfileRequest()
        r.userId = id
        return r
    }

    func byUsername(_ name: String) -> Accounts_V1_GetProfileRequest {
        var r = Accounts_V1_GetProfileRequest()
        r.username = name
        return r
    }

    @Test func profilesShowPublicFieldsOnly() async throws {
        try await withAccounts { env in
            var contact = Accounts_V1_ContactInfo()
            contact.phoneNumber = "+48 22 555 01 77"
            let bob = try await env.signUp(uniqueName("Bob"), displayName: "Bob Kowalski", contact: contact)
            let viewer = try await env.signUp().session
            let a = try await env.accounts.getProfile(byID(bob.user.userId), options: bearer(viewer)).profile
            let b = try await env.accounts.getProfile(byUsername(bob.user.username.lowercased()), options: bearer(viewer)).profile
            #expect(a == b)
            #expect(a.userId == bob.user.userId && a.username == bob.user.username && a.displayName == "Bob Kowalski")
            #expect(a.contactInfo == contact && !a.guest && a.createdAt == bob.user.createdAt)
            await expectFailure(.notFound) { try await env.accounts.getProfile(byID("01JD3KCW8S4B1C5D9E2F6G7H8J"), options: bearer(viewer)) }
            await expectFailure(.notFound) { try await env.accounts.getProfile(byUsername("nobody-here"), options: bearer(viewer)) }
            await expectFailure(.invalidArgument, fields: ["user_id"]) {
                try await env.accounts.getProfile(Accounts_V1_GetProfileRequest(), options: bearer(viewer))
            }
            await expectFailure(.unauthenticated) { try await env.accounts.getProfile(byID(bob.user.userId)) }
        }
    }

    @Test func updateProfileChangesOnlyWhatIsSet() async throws {
        try await withAccounts { env in
            var contact = Accounts_V1_ContactInfo()
            contact.phoneNumber = "+44 20 7946 0018"
            contact.publicEmail = "alice@studio.example"
            let alice = try await env.signUp(uniqueName("alice"), displayName: "Alice Martin", contact: contact)
            let s = alice.session

            var r = Accounts_V1_UpdateProfileRequest()
            var name = Google_Protobuf_StringValue()
            name.value = "Alice M."
            r.displayName = name
            let u1 = try await env.accounts.updateProfile(r, options: bearer(s)).user
            #expect(u1.displayName == "Alice M." && u1.contactInfo == contact && u1.email == alice.user.email)
            #expect(u1.updatedAt.seconds >= alice.user.updatedAt.seconds)

            r = Accounts_V1_UpdateProfileRequest()
            contact.phoneNumber = "+44 20 7946 0099"
            r.contactInfo = contact
            var email = Google_Protobuf_StringValue()
            email.value = "Alice.New-\(UUID().uuidString.prefix(6))@Example.com"
            r.email = email
            let u2 = try await env.accounts.updateProfile(r, options: bearer(s)).user
            #expect(u2.displayName == "Alice M." && u2.contactInfo == contact && u2.email == email.value)
            _ = try await env.accounts.logIn(logInRequest(email: email.value.lowercased(), password: "correct horse battery staple"))

            // Clearing the display name with an empty value.
            r = Accounts_V1_UpdateProfileRequest()
            name.value = ""
            r.displayName = name
            #expect(try await env.accounts.updateProfile(r, options: bearer(s)).user.displayName == "")

            // Every bad field at once; a taken email by name; guests have no login email.
            let other = try await env.signUp()
            r = Accounts_V1_UpdateProfileRequest()
            name.value = String(repeating: "x", count: 65)
            r.displayName = name
            email.value = "broken"
            r.email = email
            var badContact = Accounts_V1_ContactInfo()
            badContact.publicEmail = "nope"
            r.contactInfo = badContact
            await expectFailure(.invalidArgument, fields: ["display_name", "email", "contact_info.public_email"]) {
                try await env.accounts.updateProfile(r, options: bearer(s))
            }
            r = Accounts_V1_UpdateProfileRequest()
            email.value = other.user.email.uppercased()
            r.email = email
            await expectFailure(.alreadyExists, fields: ["email"]) { try await env.accounts.updateProfile(r, options: bearer(s)) }
            let guest = try await env.accounts.createGuest(Accounts_V1_CreateGuestRequest())
            email.value = "guest-mail@example.com"
            r.email = email
            await expectFailure(.failedPrecondition, fields: ["email"]) { try await env.accounts.updateProfile(r, options: bearer(guest.session)) }
        }
    }

    @Test func searchFindsFullAccountsByPrefixPageByPage() async throws {
        try await withAccounts { env in
            let tag = "ca\(UUID().uuidString.prefix(4).lowercased())"
            var names: [String] = []
            for i in 0..<7 { names.append("\(i % 2 == 0 ? tag.uppercased() : tag)_\(i)") }
            for n in names { try await env.signUp(n) }
            try await env.signUp("zz\(tag)")  // does not start with the prefix
            let guest = try await env.accounts.createGuest(Accounts_V1_CreateGuestRequest())
            let viewer = guest.session

            var r = Accounts_V1_SearchUsersRequest()
            r.usernamePrefix = tag.uppercased()
            r.pageSize = 3
            var seen: [String] = []
            var pages = 0
            repeat {
                let page = try await env.accounts.searchUsers(r, options: bearer(viewer))
                seen += page.users.map(\.username)
                #expect(page.users.count <= 3)
                #expect(page.users.allSatisfy { !$0.guest })
                r.pageToken = page.nextPageToken
                pages += 1
            } while !r.pageToken.isEmpty && pages < 10
            #expect(pages == 3)
            #expect(seen == names.sorted { $0.lowercased() < $1.lowercased() })

            // Guests never appear; the empty prefix lists everyone else.
            var all = Accounts_V1_SearchUsersRequest()
            all.pageSize = 100
            let everyone = try await env.accounts.searchUsers(all, options: bearer(viewer)).users
            #expect(everyone.count == 8 && !everyone.contains { $0.username.hasPrefix("guest-") })

            // Page tokens are bound to the prefix and cannot be forged; sizes are checked.
            r.pageToken = ""
            let first = try await env.accounts.searchUsers(r, options: bearer(viewer))
            var other = Accounts_V1_SearchUsersRequest()
            other.usernamePrefix = "zz"
            other.pageToken = first.nextPageToken
            await expectFailure(.invalidArgument, fields: ["page_token"]) { try await env.accounts.searchUsers(other, options: bearer(viewer)) }
            other.usernamePrefix = tag
            other.pageToken = first.nextPageToken + "x"
            await expectFailure(.invalidArgument, fields: ["page_token"]) { try await env.accounts.searchUsers(other, options: bearer(viewer)) }
            other.pageToken = "Y2Fzc2llfDAxSkQzS0VZMVY2RDNFN0YyRzRIOEo5SzBN"
            await expectFailure(.invalidArgument, fields: ["page_token"]) { try await env.accounts.searchUsers(other, options: bearer(viewer)) }
            other.pageToken = ""
            other.pageSize = -1
            await expectFailure(.invalidArgument, fields: ["page_size"]) { try await env.accounts.searchUsers(other, options: bearer(viewer)) }
            other.pageSize = 1000  // clamped
            #expect(try await env.accounts.searchUsers(other, options: bearer(viewer)).users.count == 7)
            other.pageSize = 0
            other.usernamePrefix = String(repeating: "a", count: 33)
            await expectFailure(.invalidArgument, fields: ["username_prefix"]) { try await env.accounts.searchUsers(other, options: bearer(viewer)) }
        }
    }

    @Test func avatarsAreUploadedImagesCheckedByMagicBytesOrBuiltIns() async throws {
        try await withAccounts({ $0.maxAvatarBytes = 64 * 1024 }) { env in
            let me = try await env.signUp()
            let viewer = try await env.signUp().session
            var get = Accounts_V1_GetAvatarRequest()
            get.userId = me.user.userId
            #expect(try await env.accounts.getAvatar(get, options: bearer(viewer)).avatar == nil)

            for (bytes, format) in [(Images.png, Accounts_V1_ImageFormat.png), (Images.jpeg, .jpeg), (Images.webp, .webp)] {
                var up = Accounts_V1_UploadAvatarRequest()
                up.image = bytes
                let avatar = try await env.accounts.uploadAvatar(up, options: bearer(me.session)).avatar
                #expect(avatar.uploaded.format == format && avatar.uploaded.sizeBytes == Int32(bytes.count))
                let read = try await env.accounts.getAvatar(get, options: bearer(viewer))
                #expect(read.image.data == bytes && read.image.format == format)
                #expect(read.image.uploadedAt == avatar.uploaded.uploadedAt)
                let mine = try await env.accounts.getMyProfile(Accounts_V1_GetMyProfileRequest(), options: bearer(me.session)).user
                #expect(mine.avatar == avatar)
            }

            var up = Accounts_V1_UploadAvatarRequest()
            up.image = Array("GIF89a".utf8) + [UInt8](repeating: 0, count: 20)
            await expectFailure(.invalidArgument, fields: ["image"]) { try await env.accounts.uploadAvatar(up, options: bearer(me.session)) }
            up.image = Array("RIFF\u{0}\u{0}\u{0}\u{0}WAVE".utf8)
            await expectFailure(.invalidArgument, fields: ["image"]) { try await env.accounts.uploadAvatar(up, options: bearer(me.session)) }
            up.image = []
            await expectFailure(.invalidArgument, fields: ["image"]) { try await env.accounts.uploadAvatar(up, options: bearer(me.session)) }
            up.image = Images.png + [UInt8](repeating: 0, count: 64 * 1024)
            await expectFailure(.resourceExhausted, fields: ["image"]) { try await env.accounts.uploadAvatar(up, options: bearer(me.session)) }

            let catalogue = try await env.accounts.listBuiltinAvatars(Accounts_V1_ListBuiltinAvatarsRequest(), options: bearer(me.session)).avatars
            #expect(catalogue.map(\.avatarId) == ["red-fox", "blue-owl", "green-frog", "golden-bear"])
            var choose = Accounts_V1_ChooseAvatarRequest()
            choose.builtinAvatarId = "blue-owl"
            #expect(try await env.accounts.chooseAvatar(choose, options: bearer(me.session)).avatar.builtinAvatarId == "blue-owl")
            let read = try await env.accounts.getAvatar(get, options: bearer(viewer))
            #expect(read.builtin.avatarId == "blue-owl" && read.builtin.name == "Blue owl")
            // The uploaded image is gone with the choice.
            let blobs = try env.core.database.readSync { c in try c.query("SELECT user_id FROM avatar_images WHERE user_id = ?", me.user.userId).count
            }
            #expect(blobs == 0)
            choose.builtinAvatarId = "purple-unicorn"
            await expectFailure(.invalidArgument, fields: ["builtin_avatar_id"]) {
                try await env.accounts.chooseAvatar(choose, options: bearer(me.session))
            }
            choose.builtinAvatarId = ""
            await expectFailure(.invalidArgument, fields: ["builtin_avatar_id"]) {
                try await env.accounts.chooseAvatar(choose, options: bearer(me.session))
            }
            get.userId = "01JD3KCW8S4B1C5D9E2F6G7H8J"
            await expectFailure(.notFound) { try await env.accounts.getAvatar(get, options: bearer(viewer)) }
            get.userId = ""
            await expectFailure(.invalidArgument, fields: ["user_id"]) { try await env.accounts.getAvatar(get, options: bearer(viewer)) }
        }
    }

    @Test func theDefaultAvatarLimitIsOneMebibyte() async throws {
        try await withAccounts { env in
            let me = try await env.signUp().session
            var up = Accounts_V1_UploadAvatarRequest()
            up.image = Images.jpeg + [UInt8](repeating: 7, count: (1 << 20) - Images.jpeg.count)
            #expect(try await env.accounts.uploadAvatar(up, options: bearer(me)).avatar.uploaded.sizeBytes == 1 << 20)
            var get = Accounts_V1_GetAvatarRequest()
            get.userId = try await env.accounts.getMyProfile(Accounts_V1_GetMyProfileRequest(), options: bearer(me)).user.userId
            #expect(try await env.accounts.getAvatar(get, options: bearer(me)).image.data == up.image)
            up.image.append(0)
            await expectFailure(.resourceExhausted, fields: ["image"]) { try await env.accounts.uploadAvatar(up, options: bearer(me)) }
            // Far larger: the transport refuses it before reading it.
            up.image += [UInt8](repeating: 1, count: 1 << 20)
            await expectFailure(.resourceExhausted) { try await env.accounts.uploadAvatar(up, options: bearer(me)) }
        }
    }
}
