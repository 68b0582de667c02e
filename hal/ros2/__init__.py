"""ROS 2 without rclpy: ROS 2 wire types over DDS (cyclonedds) and bag import (rosbags)."""
