"""The stand-ins every test folder shares (one of each):

* ``robot``: the fake robot, a ``hal.driver.RobotDriver`` (a point that integrates the action);
* ``lerobot``, ``ros2_robot``: the robots behind hal's LeRobot and ROS 2 drivers (a fake LeRobot
  follower arm; a ROS 2 JointState robot in its own process);
* ``cloud``: the cloud harness (comms' server in this process, in a child process, or a real
  ``robofleet cloud``) and a scripted robot computer;
* ``settings``: the fast settings of every section;
* ``procs``: child processes of a test, and waiting on a condition.
"""
