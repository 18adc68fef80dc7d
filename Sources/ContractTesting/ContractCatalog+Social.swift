import Contracts
import RPCCore

// Maintained by hand (the generator emits no message registry): every RPC of social.v1.Social and
// social.v1.SocialInternal with its Swift request and response types. ContractTests checks that
// this table lists exactly the methods of Social_V1_SocialMethods.all and
// Social_V1_SocialInternalMethods.all and that each type's protoMessageName matches the
// descriptor, so a new RPC fails the tests until its line is added here.
extension ContractCatalog {
    static let social = ContractCatalog.Service(
        directory: "social",
        methods: Social_V1_SocialMethods.all + Social_V1_SocialInternalMethods.all,
        rpcs: [
            ContractRPC(Social_V1_SocialMethods.createTeam, Social_V1_CreateTeamRequest.self, Social_V1_CreateTeamResponse.self),
            ContractRPC(Social_V1_SocialMethods.getMyTeam, Social_V1_GetMyTeamRequest.self, Social_V1_GetMyTeamResponse.self),
            ContractRPC(Social_V1_SocialMethods.listTeamRanking, Social_V1_ListTeamRankingRequest.self, Social_V1_ListTeamRankingResponse.self),
            ContractRPC(Social_V1_SocialMethods.leaveTeam, Social_V1_LeaveTeamRequest.self, Social_V1_LeaveTeamResponse.self),
            ContractRPC(Social_V1_SocialMethods.createHousehold, Social_V1_CreateHouseholdRequest.self, Social_V1_CreateHouseholdResponse.self),
            ContractRPC(Social_V1_SocialMethods.joinHousehold, Social_V1_JoinHouseholdRequest.self, Social_V1_JoinHouseholdResponse.self),
            ContractRPC(Social_V1_SocialMethods.renameHousehold, Social_V1_RenameHouseholdRequest.self, Social_V1_RenameHouseholdResponse.self),
            ContractRPC(Social_V1_SocialMethods.deleteHousehold, Social_V1_DeleteHouseholdRequest.self, Social_V1_DeleteHouseholdResponse.self),
            ContractRPC(Social_V1_SocialMethods.inviteHousemate, Social_V1_InviteHousemateRequest.self, Social_V1_InviteHousemateResponse.self),
            ContractRPC(Social_V1_SocialMethods.removeHousemate, Social_V1_RemoveHousemateRequest.self, Social_V1_RemoveHousemateResponse.self),
            ContractRPC(Social_V1_SocialMethods.listHousemates, Social_V1_ListHousematesRequest.self, Social_V1_ListHousematesResponse.self),
            ContractRPC(Social_V1_SocialMethods.getHousehold, Social_V1_GetHouseholdRequest.self, Social_V1_GetHouseholdResponse.self),
            ContractRPC(Social_V1_SocialMethods.listMyHouseholds, Social_V1_ListMyHouseholdsRequest.self, Social_V1_ListMyHouseholdsResponse.self),
            ContractRPC(
                Social_V1_SocialMethods.getHousemateProfile, Social_V1_GetHousemateProfileRequest.self, Social_V1_GetHousemateProfileResponse.self),
            ContractRPC(Social_V1_SocialMethods.addFriend, Social_V1_AddFriendRequest.self, Social_V1_AddFriendResponse.self),
            ContractRPC(Social_V1_SocialMethods.removeFriend, Social_V1_RemoveFriendRequest.self, Social_V1_RemoveFriendResponse.self),
            ContractRPC(Social_V1_SocialMethods.listFriends, Social_V1_ListFriendsRequest.self, Social_V1_ListFriendsResponse.self),
            ContractRPC(Social_V1_SocialMethods.blockUser, Social_V1_BlockUserRequest.self, Social_V1_BlockUserResponse.self),
            ContractRPC(Social_V1_SocialMethods.unblockUser, Social_V1_UnblockUserRequest.self, Social_V1_UnblockUserResponse.self),
            ContractRPC(Social_V1_SocialMethods.listBlockedUsers, Social_V1_ListBlockedUsersRequest.self, Social_V1_ListBlockedUsersResponse.self),
            ContractRPC(Social_V1_SocialMethods.requestFollow, Social_V1_RequestFollowRequest.self, Social_V1_RequestFollowResponse.self),
            ContractRPC(
                Social_V1_SocialMethods.acceptFollowRequest, Social_V1_AcceptFollowRequestRequest.self, Social_V1_AcceptFollowRequestResponse.self),
            ContractRPC(
                Social_V1_SocialMethods.declineFollowRequest, Social_V1_DeclineFollowRequestRequest.self, Social_V1_DeclineFollowRequestResponse.self),
            ContractRPC(Social_V1_SocialMethods.unfollow, Social_V1_UnfollowRequest.self, Social_V1_UnfollowResponse.self),
            ContractRPC(Social_V1_SocialMethods.listFollowers, Social_V1_ListFollowersRequest.self, Social_V1_ListFollowersResponse.self),
            ContractRPC(Social_V1_SocialMethods.listFollowing, Social_V1_ListFollowingRequest.self, Social_V1_ListFollowingResponse.self),
            ContractRPC(
                Social_V1_SocialMethods.listFollowRequests, Social_V1_ListFollowRequestsRequest.self, Social_V1_ListFollowRequestsResponse.self),
            ContractRPC(Social_V1_SocialMethods.listNotifications, Social_V1_ListNotificationsRequest.self, Social_V1_ListNotificationsResponse.self),
            ContractRPC(
                Social_V1_SocialMethods.markNotificationsRead, Social_V1_MarkNotificationsReadRequest.self,
                Social_V1_MarkNotificationsReadResponse.self),
            ContractRPC(
                Social_V1_SocialMethods.subscribeNotifications, Social_V1_SubscribeNotificationsRequest.self,
                Social_V1_SubscribeNotificationsResponse.self),
            ContractRPC(
                Social_V1_SocialMethods.getNotificationSettings, Social_V1_GetNotificationSettingsRequest.self,
                Social_V1_GetNotificationSettingsResponse.self),
            ContractRPC(
                Social_V1_SocialMethods.muteHelpNotifications, Social_V1_MuteHelpNotificationsRequest.self,
                Social_V1_MuteHelpNotificationsResponse.self),
            ContractRPC(
                Social_V1_SocialMethods.snoozeNotifications, Social_V1_SnoozeNotificationsRequest.self, Social_V1_SnoozeNotificationsResponse.self),
            ContractRPC(
                Social_V1_SocialMethods.registerPushTarget, Social_V1_RegisterPushTargetRequest.self, Social_V1_RegisterPushTargetResponse.self),
            ContractRPC(Social_V1_SocialMethods.listPushTargets, Social_V1_ListPushTargetsRequest.self, Social_V1_ListPushTargetsResponse.self),
            ContractRPC(Social_V1_SocialMethods.removePushTarget, Social_V1_RemovePushTargetRequest.self, Social_V1_RemovePushTargetResponse.self),
            ContractRPC(
                Social_V1_SocialMethods.setPushPreferences, Social_V1_SetPushPreferencesRequest.self, Social_V1_SetPushPreferencesResponse.self),
            ContractRPC(
                Social_V1_SocialInternalMethods.sendNotification, Social_V1_SendNotificationRequest.self, Social_V1_SendNotificationResponse.self),
            ContractRPC(
                Social_V1_SocialInternalMethods.checkRelationship, Social_V1_CheckRelationshipRequest.self, Social_V1_CheckRelationshipResponse.self),
            ContractRPC(
                Social_V1_SocialInternalMethods.listFollowedUserIds, Social_V1_ListFollowedUserIdsRequest.self,
                Social_V1_ListFollowedUserIdsResponse.self),
            ContractRPC(
                Social_V1_SocialInternalMethods.checkHouseholdMembership, Social_V1_CheckHouseholdMembershipRequest.self,
                Social_V1_CheckHouseholdMembershipResponse.self),
            ContractRPC(Social_V1_SocialInternalMethods.getTeamOfUser, Social_V1_GetTeamOfUserRequest.self, Social_V1_GetTeamOfUserResponse.self),
            ContractRPC(
                Social_V1_SocialInternalMethods.recordTeamTaskCompleted, Social_V1_RecordTeamTaskCompletedRequest.self,
                Social_V1_RecordTeamTaskCompletedResponse.self),
            ContractRPC(Social_V1_SocialInternalMethods.eraseUser, Social_V1_EraseUserRequest.self, Social_V1_EraseUserResponse.self),
        ])
}
